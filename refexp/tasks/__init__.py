"""Tasks: the data, the tokenizer and the verifiable reward a run trains and evaluates on.

``build_task(cfg.task, cache_dir)`` is the one entry point: the embedded arithmetic task (generated
and cached, character tokenizer) or GSM8K-format local files (HF tokenizer from
``task.tokenizer_path``). Either way every split has ``prompt``/``completion``/``answer`` columns,
and ``Task.reward(completion_text, answer)`` scores decoded model output without ever raising.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import datasets

from refexp.config import ConfigError, TaskConfig
from refexp.tasks.arithmetic import load_arithmetic
from refexp.tasks.fingerprint import task_fingerprint
from refexp.tasks.gsm8k import load_gsm8k
from refexp.tasks.preference import load_preference
from refexp.tasks.rewards import exact_match_reward, gsm8k_reward
from refexp.tasks.tokenizer import TextTokenizer, build_char_tokenizer

__all__ = ["Task", "TextTokenizer", "build_task", "task_fingerprint"]


@dataclass
class Task:
    """A built task. ``train``/``eval`` rows: ``prompt``, ``completion`` (demonstration, no EOS),
    ``answer`` (what ``reward`` compares against)."""

    name: str
    tokenizer: TextTokenizer
    train: datasets.Dataset
    eval: datasets.Dataset
    max_new_tokens: int
    """Generation budget; every demonstration (+ EOS) fits in it (checked by ``build_task``)."""
    reward: Callable[[str, str], float]
    """``reward(completion_text, answer) -> float`` in [0, 1]; never raises on model output."""
    max_prompt_len: int = 64
    """Every prompt (+ BOS) has at most this many tokens (checked by ``build_task``)."""
    preference: Optional[datasets.Dataset] = None
    """``prompt``/``chosen``/``rejected`` text pairs from ``task.preference_path``, when set."""

    def score(self, texts: list[str], answers: list[str], prompts: list[str]) -> list[float]:
        """``reward`` of each completion; a reward function that fails names the sample (prompt,
        completion, answer) instead of leaving a bare traceback."""
        out = []
        for i, (t, a) in enumerate(zip(texts, answers)):
            try:
                out.append(float(self.reward(t, a)))
            except Exception as e:
                raise RuntimeError(f"reward function failed on sample {i} (prompt {prompts[i]!r}, completion {t!r}, "
                                   f"answer {a!r}): {type(e).__name__}: {e}") from e
        return out


def build_task(task_cfg: TaskConfig, cache_dir: str) -> Task:
    """Load or generate the task of ``task_cfg``. Generated data goes under ``cache_dir/data``;
    ``datasets``' Arrow copies of local files under ``cache_dir/hf-datasets``."""
    tokenizer = _tokenizer(task_cfg)
    hf_cache = os.path.join(cache_dir, "hf-datasets")
    if task_cfg.name == "arithmetic":
        splits = load_arithmetic(task_cfg, os.path.join(cache_dir, "data"))
        train, held_out, reward = splits["train"], splits["test"], exact_match_reward
    elif task_cfg.name == "gsm8k":
        train, held_out = _gsm8k_splits(task_cfg, hf_cache)
        reward = gsm8k_reward
    else:  # TaskConfig.__post_init__ already rejects other names
        raise ConfigError(f"task.name={task_cfg.name!r} is invalid: expected one of arithmetic, gsm8k")
    _check_lengths(task_cfg, tokenizer, {"train": train, "eval": held_out})
    preference = None
    if task_cfg.preference_path is not None:
        preference = load_preference(task_cfg.preference_path, tokenizer, cache_dir=hf_cache)
    return Task(
        name=task_cfg.name,
        tokenizer=tokenizer,
        train=train,
        eval=held_out,
        max_new_tokens=task_cfg.max_new_tokens,
        reward=reward,
        max_prompt_len=task_cfg.max_prompt_len,
        preference=preference,
    )


def _tokenizer(task_cfg: TaskConfig) -> TextTokenizer:
    if task_cfg.tokenizer_path is not None:
        return TextTokenizer.from_dir(task_cfg.tokenizer_path)
    if task_cfg.name == "arithmetic":
        return build_char_tokenizer()
    raise ConfigError(
        f"task.tokenizer_path=None is invalid for task.name={task_cfg.name}: expected an HF checkpoint "
        f"directory with tokenizer.json (the character tokenizer only covers the arithmetic task)"
    )


def _gsm8k_splits(task_cfg: TaskConfig, hf_cache: str) -> tuple[datasets.Dataset, datasets.Dataset]:
    train = load_gsm8k(task_cfg.train_path, cache_dir=hf_cache)
    if task_cfg.eval_path is not None:
        return train, load_gsm8k(task_cfg.eval_path, cache_dir=hf_cache)
    # No eval file: hold out a seeded random slice of train (the file may be sorted, so not its tail).
    if task_cfg.num_eval >= len(train):
        raise ConfigError(
            f"task.num_eval={task_cfg.num_eval} is invalid: expected fewer than the {len(train)} rows of "
            f"task.train_path={task_cfg.train_path!r} (held out from it because task.eval_path is unset)"
        )
    split = train.train_test_split(test_size=task_cfg.num_eval, shuffle=True, seed=task_cfg.data_seed)
    return split["train"], split["test"]


def _check_lengths(task_cfg: TaskConfig, tokenizer: TextTokenizer, splits: dict[str, datasets.Dataset]) -> None:
    """Fail before any model is built when a prompt exceeds ``task.max_prompt_len`` or a
    demonstration (+ EOS) exceeds ``task.max_new_tokens``; the messages give the value that fits."""
    for column, field, limit, count in (
        ("prompt", "task.max_prompt_len", task_cfg.max_prompt_len, lambda t: len(tokenizer.encode(t, add_bos=True))),
        ("completion", "task.max_new_tokens", task_cfg.max_new_tokens, lambda t: len(tokenizer.encode(t)) + 1),
    ):
        longest = (0, "", -1)
        for split, ds in splits.items():
            for i, text in enumerate(ds[column]):
                if (n := count(text)) > longest[0]:
                    longest = (n, split, i)
        n, split, i = longest
        if n > limit:
            what = "BOS included where the tokenizer has one" if column == "prompt" else "EOS included"
            raise ConfigError(
                f"{field}={limit} is invalid: expected at least {n} (the {column} of {split} row {i} "
                f"has {n} tokens, {what})"
            )
