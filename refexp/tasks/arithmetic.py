"""The embedded task: fixed-width integer arithmetic, generated deterministically from ``TaskConfig``.

Format (a probe found a tiny llama3 learns this one, and not the unpadded one):
operands zero-padded to ``digits`` (``042+317=``), the answer zero-padded to a fixed width and
written most-significant digit first (``0359``):

=====  ==================  =================================================
op     answer width        convention
=====  ==================  =================================================
``+``  ``digits + 1``      any two operands
``-``  ``digits``          the first operand is the larger (``a >= b``), so
                           results are never negative
``*``  ``2 * digits``      any two operands
=====  ==================  =================================================

``task.ops`` are the skills SFT learns, ``task.rl_ops`` those RL trains (``refexp.tasks.build_task`` splits the
rows by operator with ``rows_of_ops``).

Train and test are disjoint sets of problems ``(op, a, b)``. The test set is drawn first from its
own random stream, so it depends on (digits, ops, num_eval, data_seed) but not on ``num_train``.
Columns: ``prompt``, ``completion`` (the demonstration SFT imitates), ``answer`` (what the reward
checks) and ``solution`` (the correct completion). They differ only with ``task.demo_slip``: a share of
the training demonstrations of ``+`` problems whose ones column carries forget that carry in the tens
digit (``018+025=`` demonstrated as ``0033``, not ``0043``), the same problems at every run (seeded by
``data_seed``); the test split is never touched. ``docs/headroom-task.md`` says why.

The splits are saved as a ``datasets.DatasetDict`` under a directory keyed by a hash of these
fields, written atomically so concurrent processes (torchrun ranks, a sweep) share one copy.
"""

from __future__ import annotations

import math
import os
import random
from pathlib import Path

import datasets
import numpy as np

from refexp.config import ConfigError, TaskConfig
from refexp.record.atomic import atomic_dir
from refexp.record.cache_dirs import marker_check, verified_entry, write_entry_manifest
from refexp.record.hashing import stable_hash

FORMAT_VERSION = 2
"""Bump when the generated text changes, so cached datasets of the old format are not reused."""
MAX_DIGITS = 9
"""Problem indices must fit ``random.sample``'s ``range`` (an int64): 10**18 pairs."""


def answer_width(op: str, digits: int) -> int:
    """Characters of the zero-padded answer of ``op`` on ``digits``-digit operands."""
    return {"+": digits + 1, "-": digits, "*": 2 * digits}[op]


def format_problem(op: str, a: int, b: int, digits: int) -> tuple[str, str, str]:
    """``(prompt, completion, answer)`` of one problem, e.g. ``("042+317=", "0359", "359")``."""
    result = {"+": a + b, "-": a - b, "*": a * b}[op]
    prompt = f"{a:0{digits}d}{op}{b:0{digits}d}="
    return prompt, f"{result:0{answer_width(op, digits)}d}", str(result)


def arithmetic_fingerprint(cfg: TaskConfig) -> str:
    """Short hash of everything that determines the generated splits."""
    key = {
        "format": FORMAT_VERSION,
        "digits": cfg.digits,
        "ops": list(cfg.ops),
        "num_train": cfg.num_train,
        "num_eval": cfg.num_eval,
        "data_seed": cfg.data_seed,
    }
    if cfg.demo_slip:  # only when set: the clean task keeps its key
        key["demo_slip"] = cfg.demo_slip
    return stable_hash(key, 16)


def generate_arithmetic(cfg: TaskConfig) -> datasets.DatasetDict:
    """The ``train``/``test`` splits (columns ``prompt``, ``completion``, ``answer``), in memory."""
    _check(cfg)
    train_rows, test_rows = [], []
    for op, n_train, n_test in _per_op_counts(cfg):
        size = _space_size(op, cfg.digits)
        # String seeds are hashed with SHA-512 by `random`, so the streams are stable across runs.
        test = random.Random(f"{cfg.data_seed}/{op}/test").sample(range(size), n_test)
        train = _sample_excluding(random.Random(f"{cfg.data_seed}/{op}/train"), size, n_train, test)
        test_rows += [(op, index) for index in test]
        train_rows += [(op, index) for index in train]
    # Interleave the ops (each split is drawn op by op above).
    random.Random(f"{cfg.data_seed}/shuffle/test").shuffle(test_rows)
    random.Random(f"{cfg.data_seed}/shuffle/train").shuffle(train_rows)
    slip_rng = random.Random(f"{cfg.data_seed}/demo_slip")
    slipped = [slip_rng.random() < cfg.demo_slip for _ in train_rows]  # drawn for every row: stable per problem
    return datasets.DatasetDict(
        train=_to_dataset(train_rows, cfg.digits, slipped), test=_to_dataset(test_rows, cfg.digits)
    )


def load_arithmetic(cfg: TaskConfig, data_dir: str) -> datasets.DatasetDict:
    """The splits of ``cfg``, generated once into ``data_dir/arithmetic-<fingerprint>`` and reused.

    Several processes may call this at once: each writes a private temp dir and renames it into
    place (``refexp.record.atomic.atomic_dir``); the rename of a later one fails on the now complete target and
    it loads the winner's.
    """
    final = os.path.join(data_dir, f"arithmetic-{arithmetic_fingerprint(cfg)}")
    if _dataset_saved(Path(final)):
        verified_entry(final, "arithmetic data")
    else:
        _check(cfg)  # before creating anything
        with atomic_dir(final, is_complete=_dataset_saved) as tmp:
            generate_arithmetic(cfg).save_to_disk(str(tmp))
            write_entry_manifest(tmp)  # last, before the rename publishes the entry
    return datasets.load_from_disk(final)


_dataset_saved = marker_check("dataset_dict.json")
"""Whether a generated data dir is complete (``DatasetDict.save_to_disk`` wrote its ``dataset_dict.json``)."""


def _check(cfg: TaskConfig) -> None:
    if cfg.digits > MAX_DIGITS:
        raise ConfigError(f"task.digits={cfg.digits!r} is invalid: expected at most {MAX_DIGITS}")
    if not cfg.ops:
        raise ConfigError("task.ops=[] is invalid: expected at least one of +, -, *")
    for op, n_train, n_test in _per_op_counts(cfg):
        size = _space_size(op, cfg.digits)
        if n_test + n_train > size:
            raise ConfigError(
                f"task.num_train={cfg.num_train} + task.num_eval={cfg.num_eval} is invalid: op {op!r} on "
                f"{cfg.digits}-digit operands has only {size} distinct problems and needs {n_train + n_test} "
                f"(train and test are disjoint); lower them or raise task.digits"
            )


def _per_op_counts(cfg: TaskConfig) -> list[tuple[str, int, int]]:
    """``(op, n_train, n_test)`` per distinct op: the counts split evenly, the first ops taking the
    remainder (a repeated op in ``task.ops`` would only repeat problems, so it counts once)."""
    ops = list(dict.fromkeys(cfg.ops))
    return [
        (op, cfg.num_train // len(ops) + (i < cfg.num_train % len(ops)),
         cfg.num_eval // len(ops) + (i < cfg.num_eval % len(ops)))
        for i, op in enumerate(ops)
    ]


def _space_size(op: str, digits: int) -> int:
    n = 10**digits
    return n * (n + 1) // 2 if op == "-" else n * n  # "-": unordered pairs a >= b


def _operands(op: str, index: int, digits: int) -> tuple[int, int]:
    """Problem number ``index`` of ``op``'s space, as ``(a, b)``."""
    n = 10**digits
    if op != "-":
        return divmod(index, n)
    # Pairs a >= b enumerated row by row: row a starts at the triangular number a(a+1)/2.
    a = (math.isqrt(8 * index + 1) - 1) // 2
    return a, index - a * (a + 1) // 2


def _sample_excluding(rng: random.Random, size: int, k: int, excluded: list[int]) -> list[int]:
    """``k`` distinct indices of ``range(size)`` that are not in ``excluded``, without listing the range.

    Draw from ``range(size - len(excluded))`` and map the j-th kept index to its value: j plus the
    number of excluded indices at or below it. With the excluded sorted, ``e_i - i`` counts the kept
    indices below ``e_i``, so that number is a ``searchsorted``.
    """
    drawn = np.asarray(rng.sample(range(size - len(excluded)), k), dtype=np.int64)
    ex = np.sort(np.asarray(excluded, dtype=np.int64))
    return (drawn + np.searchsorted(ex - np.arange(len(ex)), drawn, side="right")).tolist()


def problem_op(prompt: str, digits: int) -> str:
    """The operator of a generated problem from its prompt (``042-017=`` -> ``-``)."""
    return prompt[digits]


def rows_of_ops(rows: datasets.Dataset, ops: list[str], digits: int) -> datasets.Dataset:
    """The rows of ``rows`` whose problem's operator is in ``ops``, in their order (an index mapping over the
    same table: nothing is written next to a saved dataset)."""
    keep = set(ops)
    # [:]: the column as one list (datasets 4 iterates a Column row by row, seconds for the default 20,000 rows)
    return rows.select([i for i, p in enumerate(rows["prompt"][:]) if problem_op(p, digits) in keep])


def ones_carry(op: str, a: int, b: int) -> bool:
    """Whether ``a op b`` is a sum whose ones column carries (the problems ``task.demo_slip`` applies to)."""
    return op == "+" and a % 10 + b % 10 >= 10


def imitation_ceiling(prompts: list[str], digits: int, demo_slip: float) -> float:
    """The greedy exact match on ``prompts`` of a model that learned the demonstrations' distribution exactly:
    greedy decoding writes each problem's most frequent demonstration, which is wrong on the sums whose ones
    column carries when ``task.demo_slip`` > 0.5 (half of them at exactly 0.5; docs/headroom-task.md). What a
    converged SFT start reaches on the validation split, and no more."""
    if not prompts:
        return float("nan")
    wrong = 1.0 if demo_slip > 0.5 else 0.5 if demo_slip == 0.5 else 0.0
    carrying = sum(ones_carry(problem_op(p, digits), int(p[:digits]), int(p[digits + 1:2 * digits + 1]))
                   for p in prompts)
    return 1.0 - wrong * carrying / len(prompts)


def slip_carry(completion: str) -> str:
    """The demonstrator's error of ``task.demo_slip`` on a sum whose ones column carries: the tens digit
    written without that carry (one digit off by one: ``0043`` -> ``0033``, ``0101`` -> ``0191``)."""
    tens = (int(completion[-2]) - 1) % 10
    return completion[:-2] + str(tens) + completion[-1]


def _to_dataset(rows: list[tuple[str, int]], digits: int, slipped: list[bool] | None = None) -> datasets.Dataset:
    prompts, completions, answers, solutions = [], [], [], []
    for i, (op, index) in enumerate(rows):
        x, y = _operands(op, index, digits)
        p, c, a = format_problem(op, x, y, digits)
        prompts.append(p)
        completions.append(slip_carry(c) if slipped is not None and slipped[i] and ones_carry(op, x, y) else c)
        answers.append(a)
        solutions.append(c)
    return datasets.Dataset.from_dict({"prompt": prompts, "completion": completions, "answer": answers,
                                       "solution": solutions})
