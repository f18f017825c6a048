"""The ``task/`` group: where prompts, answers and the verifiable reward come from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .errors import check, one_of, positive_int


@dataclass
class TaskConfig:
    """Where prompts, answers and the verifiable reward come from. The defaults are the embedded
    arithmetic task (``task/arithmetic.yaml``); ``task/gsm8k.yaml`` sets the real-data fields."""

    name: str = "arithmetic"
    """arithmetic (embedded, generated) | gsm8k (local files of the GSM8K schema)."""
    digits: int = 3
    """arithmetic: digits of each (zero-padded) operand."""
    ops: list[str] = field(default_factory=lambda: ["+"])
    """arithmetic: operators drawn from (+, -, *)."""
    num_train: int = 20000
    """arithmetic: generated training problems."""
    num_eval: int = 500
    """Held-out problems (split off the training file when ``eval_path`` is None)."""
    data_seed: int = 1234
    """Seeds problem generation and the held-out split."""
    train_path: Optional[str] = None
    """A local .jsonl/.json/.parquet file (or a saved ``datasets`` dir) with question/answer columns."""
    eval_path: Optional[str] = None
    """A local held-out file (None: split ``num_eval`` rows off ``train_path``)."""
    preference_path: Optional[str] = None
    """DPO on a public preference dataset: prompt/chosen/rejected strings or chat ``messages``."""
    tokenizer_path: Optional[str] = None
    """HF tokenizer dir (tokenizer.json); None = refexp's character tokenizer for the embedded task."""
    max_prompt_len: int = 64
    """Prompts longer than this (in tokens) are rejected when the task is built."""
    max_new_tokens: int = 6
    """Generation budget; 6 fits a 3-digit sum's 4 digits + EOS with one token to spare."""

    def __post_init__(self) -> None:
        one_of("task.name", self.name, ("arithmetic", "gsm8k"))
        positive_int("task.digits", self.digits)
        for op in self.ops:
            one_of("task.ops[]", op, ("+", "-", "*"))
        positive_int("task.num_train", self.num_train)
        positive_int("task.num_eval", self.num_eval)
        positive_int("task.max_prompt_len", self.max_prompt_len)
        positive_int("task.max_new_tokens", self.max_new_tokens)
        if self.name == "gsm8k":
            check(self.train_path is not None, "task.train_path", self.train_path,
                  "a local GSM8K-format file when task.name=gsm8k (nothing is downloaded at run time)")
