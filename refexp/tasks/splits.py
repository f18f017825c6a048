"""A task's train / held-out / validation splits, and the length checks they must pass.

- held-out (``Task.eval``): ``task.eval_path``, else ``task.num_eval`` rows held out of train (seeded
  by ``task.data_seed``); the embedded task generates its own. The ``preference`` task's held-out rows
  are pairs, by the same rule applied to ``task.preference_path`` (``preference_splits``).
- validation (``Task.val``): ``task.val_path``, else ``task.val_share()`` of the remaining training
  rows (seeded by ``task.data_seed``; the embedded task carves 2.5% by default), else None. It is cut
  after the held-out split, so adding one never changes ``Task.eval``. SFT stopping and model selection
  read it; the held-out (test) split is only ever measured.
"""

from __future__ import annotations

from typing import Optional

import datasets

from refexp.config import ConfigError, TaskConfig
from refexp.tasks.gsm8k import load_gsm8k
from refexp.tasks.preference import load_preference
from refexp.tasks.tokenizer import TextTokenizer

TARGET_ALGOS = ("sft", "dpo")
"""Algorithms that train on the reference answers as targets (SFT's demonstrations, DPO's chosen side),
so the longest one must fit ``task.max_new_tokens``. GRPO generates its completions, which may be
truncated at the budget: its answers are only compared with, never decoded to."""


def gsm8k_splits(task_cfg: TaskConfig, hf_cache: str) -> tuple[datasets.Dataset, datasets.Dataset]:
    """``(train, eval)`` of GSM8K-format data."""
    train = _load(task_cfg, task_cfg.train_path, task_cfg.train_split, hf_cache)
    if task_cfg.eval_path is not None:
        return train, _load(task_cfg, task_cfg.eval_path, task_cfg.eval_split, hf_cache)
    return _hold_out(task_cfg, train, "task.train_path", task_cfg.train_path)


def preference_splits(task_cfg: TaskConfig, tokenizer: TextTokenizer, hf_cache: str
                      ) -> tuple[datasets.Dataset, datasets.Dataset]:
    """``(train, eval)`` pairs of the ``preference`` task: ``task.eval_path`` as the held-out pairs, else
    ``task.num_eval`` pairs held out of ``task.preference_path``."""
    def load(path: str, split: str) -> datasets.Dataset:
        return load_preference(path, tokenizer, split=split, config=task_cfg.dataset_config, cache_dir=hf_cache,
                               columns=(task_cfg.prompt_column, task_cfg.chosen_column, task_cfg.rejected_column))

    train = load(task_cfg.preference_path, task_cfg.train_split)
    if task_cfg.eval_path is not None:
        return train, load(task_cfg.eval_path, task_cfg.eval_split)
    return _hold_out(task_cfg, train, "task.preference_path", task_cfg.preference_path)


def _hold_out(task_cfg: TaskConfig, train: datasets.Dataset, field: str, path: str
              ) -> tuple[datasets.Dataset, datasets.Dataset]:
    """``task.num_eval`` rows of ``train`` held out, a seeded random slice (the file may be sorted, so not its tail)."""
    if task_cfg.num_eval >= len(train):
        raise ConfigError(
            f"task.num_eval={task_cfg.num_eval} is invalid: expected fewer than the {len(train)} rows of "
            f"{field}={path!r} (held out from it because task.eval_path is unset)"
        )
    split = train.train_test_split(test_size=task_cfg.num_eval, shuffle=True, seed=task_cfg.data_seed)
    return split["train"], split["test"]


def val_split(task_cfg: TaskConfig, train: datasets.Dataset, hf_cache: str
              ) -> tuple[datasets.Dataset, Optional[datasets.Dataset]]:
    """``(train, val)``: ``val`` read from ``task.val_path`` (train untouched), carved off ``train``
    by ``task.val_fraction``, or None."""
    if task_cfg.val_path is not None:  # gsm8k only: TaskConfig refuses it for the other tasks
        return train, _load(task_cfg, task_cfg.val_path, task_cfg.val_split, hf_cache)
    share = task_cfg.val_share()
    if not share:
        return train, None
    n_val = val_count(task_cfg, len(train))
    if not 0 < n_val < len(train):
        raise ConfigError(f"task.val_fraction={share} is invalid: it leaves {n_val} of the "
                          f"{len(train)} training rows for validation; expected a share giving at least one "
                          f"row to each side")
    split = train.train_test_split(test_size=n_val, shuffle=True, seed=task_cfg.data_seed)
    return split["train"], split["test"]


def val_count(task_cfg: TaskConfig, n_train: int) -> int:
    """How many of ``n_train`` training rows ``val_split`` carves off as validation (``task.val_fraction``)."""
    return int(round(task_cfg.val_share() * n_train))


def check_lengths(task_cfg: TaskConfig, tokenizer: TextTokenizer, splits: dict[str, datasets.Dataset],
                  algo: str, *, max_seq_len: int | None = None, new_tokens: tuple[str, int] | None = None) -> None:
    """Fail before any model is built when a prompt exceeds ``task.max_prompt_len``, when the longest prompt
    + the generation budget (``new_tokens``: its field and value, default ``task.max_new_tokens``) exceed
    ``max_seq_len`` (``model.max_seq_len``, when known), or, for an algorithm in ``TARGET_ALGOS``, a
    demonstration (+ EOS) exceeds ``task.max_new_tokens``; the messages give the value that fits.

    The sequence check is here because a data file's prompt lengths are first known here (the embedded
    task's are known from the config: ``refexp.config.root.check_sequence_fits``)."""
    prompt_n, prompt_at = _longest(splits, ("prompt",), lambda t: len(tokenizer.encode(t, add_bos=True)))
    if prompt_n > task_cfg.max_prompt_len:
        raise ConfigError(
            f"task.max_prompt_len={task_cfg.max_prompt_len} is invalid: expected at least {prompt_n} (the prompt of "
            f"{prompt_at} has {prompt_n} tokens, BOS included where the tokenizer has one)"
        )
    field, budget = new_tokens or ("task.max_new_tokens", task_cfg.max_new_tokens)
    if max_seq_len is not None and prompt_n + budget > max_seq_len:
        raise ConfigError(
            f"{field}={budget} is invalid with model.max_seq_len={max_seq_len}: expected at most "
            f"{max_seq_len - prompt_n} (the prompt of {prompt_at} has {prompt_n} tokens, and prompt + generated "
            f"tokens must fit the model's positions)"
        )
    if algo in TARGET_ALGOS:  # a preference task's rows hold chosen/rejected instead of one completion
        n, at = _longest(splits, ("completion", "chosen", "rejected"), lambda t: len(tokenizer.encode(t)) + 1)
        if n > task_cfg.max_new_tokens:
            raise ConfigError(
                f"task.max_new_tokens={task_cfg.max_new_tokens} is invalid: expected at least {n}, the longest "
                f"reference answer ({at} has {n} tokens, EOS included), since algo={algo} trains on the answers "
                f"(GRPO does not: it generates and truncates at the budget)"
            )


def _longest(splits: dict[str, datasets.Dataset], columns: tuple[str, ...], count) -> tuple[int, str]:
    """The largest ``count(text)`` over ``columns`` of every split, and where (``"<split> row <i>"``)."""
    longest = (0, "")
    for split, ds in splits.items():
        for column in (c for c in columns if c in ds.column_names):
            for i, text in enumerate(ds[column][:]):  # [:]: one list (datasets 4 iterates a Column row by row)
                if text is None:  # no reference answer (refexp.tasks.data_checks refuses training on it)
                    continue
                if (n := count(text)) > longest[0]:
                    longest = (n, f"{split} row {i}")
    return longest


def _load(task_cfg: TaskConfig, path: str, split: str, hf_cache: str) -> datasets.Dataset:
    return load_gsm8k(path, split=split, config=task_cfg.dataset_config, question_column=task_cfg.question_column,
                      answer_column=task_cfg.answer_column, cache_dir=hf_cache)
