"""Disjoint splits of reasoning-gym datasets (``task=reasoning_gym``).

Item ``i`` of a reasoning-gym dataset of seed ``s`` is generated from ``Random(s + i)``, so datasets of seeds ``s``
and ``s + 1`` share all but one item. Each split therefore draws from its own block of seeds, ``SEED_STRIDE`` apart
(far more than any split's draws), and every split skips a question already drawn by an earlier one (or by
itself): a small problem space repeats questions from distinct seeds. The blocks, from ``task.data_seed``:

=====================  =========================================================================================
block                  rows
=====================  =========================================================================================
0: test                ``task.num_eval`` of ``task.dataset`` (drawn first: it does not depend on ``num_train``)
1: train               ``task.num_train`` of ``task.dataset``; ``refexp.tasks.splits.val_split`` carves the
                       validation rows off them (``task.val_fraction``)
2 + 2k: retained test  ``task.num_eval`` rows over the ``task.retention_datasets`` (split evenly), dataset k's
3 + 2k: retained val   as many rows as the validation split has, the same way
=====================  =========================================================================================

A split of ``task.dataset`` that cannot get its distinct questions is refused (its size is the user's). A retained
dataset that holds fewer distinct questions than its two shares ask (the default one-digit products: 100) gives
them what it holds instead, split between them in the proportion asked, and says so: a first command with the
task's default sizes runs (``retention``).

``drawn`` draws every split once per process (the run's checks before any model is fetched and the task build read
the same draws); ``gym_splits`` renders the prompts (``refexp.tasks.reasoning_gym.render_prompt``) and builds the
reward.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any, NamedTuple, Optional

import datasets

from refexp.config import ConfigError, TaskConfig
from refexp.tasks import reasoning_gym as gym
from refexp.tasks.splits import val_count, val_split
from refexp.tasks.tokenizer import TextTokenizer

SEED_STRIDE = 10**9
"""Seeds between two blocks: a block draws at most ``MAX_DRAWS_PER_ROW`` times its rows, far fewer."""
MAX_DRAWS_PER_ROW = 20
"""Draws allowed per wanted row before a split gives up on finding new questions (the space is too small)."""


def retention_specs(task_cfg: TaskConfig) -> list[tuple[str, dict[str, Any]]]:
    """``(name, config)`` of each ``task.retention_datasets`` entry (a name, or ``{name: ..., <config>}``)."""
    out = []
    for spec in task_cfg.retention_datasets:
        if isinstance(spec, str):
            out.append((spec, {}))
        else:
            spec = dict(spec)
            out.append((spec.pop("name"), spec))
    return out


class Draws:
    """Rows drawn from reasoning-gym datasets, each question at most once across every split drawn."""

    def __init__(self, seed: int, prefill: str = "") -> None:
        self.seed = seed
        self.prefill = prefill
        self.seen: set[str] = set()
        self.built: dict[str, Any] = {}
        """name -> a dataset of that name (its ``score_answer`` is what the reward calls)."""
        self.entries: dict[gym.EntryKey, dict] = {}
        """Every entry drawn, by ``(name, seed, index)`` (what the reward scores against)."""

    def rows(self, name: str, kwargs: dict[str, Any], n: int, block: int, field: str, *, at_most: bool = False
             ) -> list[dict]:
        """``n`` rows of dataset ``name`` with new questions, from the seeds of ``block``; ``at_most``: the rows
        found when ``MAX_DRAWS_PER_ROW * n`` draws give fewer (else a ConfigError naming ``field``)."""
        if n == 0:
            return []
        draws = MAX_DRAWS_PER_ROW * n
        seed = self.seed + block * SEED_STRIDE
        ds = gym.create(name, kwargs, seed=seed, size=draws, field=field)
        self.built.setdefault(name, ds)
        out = []
        for i in range(draws):
            entry = gym.first_item(ds, name, kwargs, field=field) if i == 0 else ds[i]
            if entry["question"] in self.seen:
                continue
            self.seen.add(entry["question"])
            self.entries[(name, seed, i)] = entry
            out.append({"prompt": entry["question"], "completion": gym.demonstration(entry, self.prefill),
                        "answer": gym.answer_record((name, seed, i), entry), "question": entry["question"]})
            if len(out) == n:
                return out
        if at_most:
            return out
        raise ConfigError(f"{field}={name!r} with config {kwargs!r} is too small for the sizes asked: {draws} draws "
                          f"gave {len(out)} new questions of the {n} wanted (every split's questions are distinct); "
                          f"lower task.num_train / task.num_eval or widen the dataset's config")


def generate(task_cfg: TaskConfig) -> tuple[datasets.Dataset, datasets.Dataset, Draws]:
    """``(train, test, draws)`` of ``task.dataset``: test drawn first, then train (validation is carved off train
    by the caller); ``draws`` continues with the retention splits (``retention``)."""
    draws = Draws(task_cfg.data_seed, task_cfg.answer_prefill)
    name, kwargs = task_cfg.dataset, dict(task_cfg.dataset_kwargs)
    test = draws.rows(name, kwargs, task_cfg.num_eval, 0, "task.dataset")
    train = draws.rows(name, kwargs, task_cfg.num_train, 1, "task.dataset")
    return datasets.Dataset.from_list(train), datasets.Dataset.from_list(test), draws


RETAINED_FIELD = "task.retention_datasets[]"


def retention(task_cfg: TaskConfig, draws: Draws, n_val: int) -> dict[str, datasets.Dataset | None]:
    """``retain_eval`` (``task.num_eval`` rows) and ``retain_val`` (``n_val`` rows; None when 0) over the
    ``task.retention_datasets``, split evenly (the first taking the remainder), interleaved by a seeded shuffle;
    {} when none is listed. A dataset whose draws find fewer distinct questions than its two shares ask gives what
    they found (``fit_shares``)."""
    specs = retention_specs(task_cfg)
    if not specs:
        return {}
    wanted = {"retain_eval": task_cfg.num_eval, "retain_val": n_val}
    shares = {key: [n // len(specs) + (k < n % len(specs)) for k in range(len(specs))] for key, n in wanted.items()}
    found: dict[str, list[list[dict]]] = {key: [] for key in wanted}  # key -> dataset k's rows
    for key, offset in (("retain_eval", 2), ("retain_val", 3)):
        for k, (name, kwargs) in enumerate(specs):
            found[key].append(draws.rows(name, kwargs, shares[key][k], offset + 2 * k, RETAINED_FIELD, at_most=True))
    for k, spec in enumerate(task_cfg.retention_datasets):
        asked = {key: shares[key][k] for key in wanted}
        if any(len(found[key][k]) < asked[key] for key in wanted):
            pool = found["retain_eval"][k] + found["retain_val"][k]  # every question its draws found, all distinct
            found["retain_eval"][k], found["retain_val"][k] = fit_shares(pool, asked, spec)
    out: dict[str, datasets.Dataset | None] = {}
    for key in wanted:
        rows = [row for per_dataset in found[key] for row in per_dataset]
        random.Random(f"{task_cfg.data_seed}/{key}").shuffle(rows)
        out[key] = datasets.Dataset.from_list(rows) if rows else None
    return out


def fit_shares(pool: list[dict], asked: dict[str, int], spec: Any) -> tuple[list[dict], list[dict]]:
    """``(retained test rows, retained validation rows)`` of a retained dataset whose draws found only the questions
    of ``pool`` (fewer than the two shares ``asked`` add up to): ``pool`` split in the proportion asked, each share
    that asked for rows given at least one, and a note saying so; a ConfigError naming ``spec`` when ``pool`` cannot
    give each one a row."""
    eval_n, val_n = asked["retain_eval"], asked["retain_val"]
    needed = (eval_n > 0) + (val_n > 0)
    if len(pool) < needed:
        raise ConfigError(f"{RETAINED_FIELD}={spec!r} is too small to measure retention: its draws found "
                          f"{len(pool)} distinct question(s), and the retained test and validation splits need a "
                          f"question each; widen its config or list another dataset")
    keep_eval = min(eval_n, max(1 if eval_n else 0, round(len(pool) * eval_n / (eval_n + val_n))))
    keep_eval = min(keep_eval, len(pool) - (val_n > 0))
    keep_val = min(val_n, len(pool) - keep_eval)
    print(f"[refexp] note: {RETAINED_FIELD}={json.dumps(spec)} holds {len(pool)} distinct questions, fewer than "
          f"the {eval_n + val_n} asked (the retained test split's {eval_n}, the retained validation split's "
          f"{val_n}): they get {keep_eval} and {keep_val} (each question in one split)", flush=True)
    return pool[:keep_eval], pool[keep_eval:keep_eval + keep_val]


class Drawn(NamedTuple):
    """Every split of a reasoning-gym task as drawn, its prompts not rendered yet (``drawn``)."""

    train: datasets.Dataset
    """``task.num_train`` rows of ``task.dataset``, validation still in them."""
    test: datasets.Dataset
    retained: dict[str, Optional[datasets.Dataset]]
    """``retention``'s ``retain_eval`` / ``retain_val``; {} without retained datasets."""
    draws: Draws


DRAW_FIELDS = ("dataset", "dataset_kwargs", "retention_datasets", "data_seed", "answer_prefill", "num_train",
               "num_eval", "val_fraction", "val_path")
"""The ``task.*`` fields the draws depend on (the tokenizer and the rendering do not enter them)."""


def drawn(task_cfg: TaskConfig) -> Drawn:
    """Every split of ``task_cfg``'s datasets, drawn once per process for the same ``DRAW_FIELDS``: the run's checks
    before a model is fetched (``refexp.tasks.data_checks``) and the task build read the same rows."""
    gym.library()  # a missing install is named every time, not only on the first draw
    key = json.dumps({f: getattr(task_cfg, f) for f in DRAW_FIELDS}, sort_keys=True, default=str)
    if key not in _DRAWN:
        train, test, draws = generate(task_cfg)
        retained = retention(task_cfg, draws, val_count(task_cfg, len(train)))
        while len(_DRAWN) >= KEEP_DRAWN:
            _DRAWN.pop(next(iter(_DRAWN)))
        _DRAWN[key] = Drawn(train, test, retained, draws)
    return _DRAWN[key]


KEEP_DRAWN = 2
"""Tasks whose draws ``drawn`` keeps (the oldest go first): a run reads one."""
_DRAWN: dict[str, Drawn] = {}


def gym_splits(task_cfg: TaskConfig, tokenizer: TextTokenizer, hf_cache: str
               ) -> tuple[datasets.Dataset, datasets.Dataset, Optional[datasets.Dataset],
                          dict[str, Optional[datasets.Dataset]], Callable[[str, str], float]]:
    """``(train, test, val, retention, reward)`` of ``task=reasoning_gym``: the rows of ``generate`` with the
    validation split carved off train (``task.val_fraction``), ``retention``'s ``retain_eval`` / ``retain_val``, every
    prompt rendered (with the tokenizer's chat template when ``task.chat_template``), and the reward that scores
    them all (``refexp.tasks.reasoning_gym.make_reward``)."""
    train, test, retained, draws = drawn(task_cfg)
    train, val = val_split(task_cfg, train, hf_cache)
    system = gym.system_prompt(task_cfg.system_prompt)
    renderer = tokenizer if task_cfg.chat_template else None
    if renderer is not None:
        tokenizer.system_prompt = system  # the task's system message wherever this tokenizer renders a chat

    def render(ds: Optional[datasets.Dataset]) -> Optional[datasets.Dataset]:
        if ds is None:
            return None
        return ds.map(lambda row: {"prompt": gym.render_prompt(row["question"], system, renderer,
                                                               task_cfg.answer_prefill)}, keep_in_memory=True)

    train, test, val = render(train), render(test), render(val)
    retained = {k: render(ds) for k, ds in retained.items()}
    return train, test, val, retained, gym.make_reward(draws.built, draws.entries, task_cfg.answer_prefill)
