"""Tasks: the data, the tokenizer and the verifiable reward a run trains and evaluates on.

``build_task(cfg.task, cache_dir, algo=...)`` is the one entry point: the embedded arithmetic task
(generated and cached, character tokenizer), GSM8K-format data from local files, folders or the Hub
(HF tokenizer from ``task.tokenizer_path``), a reasoning-gym dataset (``task.name=reasoning_gym``, generated,
scored by the dataset's own verifier: ``refexp.tasks.reasoning_gym``), or preference pairs only
(``task.name=preference``: its ``train`` and ``eval`` rows are ``prompt``/``chosen``/``rejected`` pairs, and it has
no reward).
Otherwise every split has ``prompt``/``completion``/``answer`` columns, and
``Task.reward(completion_text, answer)`` (the verifier) scores decoded model output: the task's own reward never
raises; a ``task.reward`` hook that does is named with its sample by ``Task.verify``. ``Task.score`` is the reward
a run optimises: the verifier, or a learned reward that GRPO attaches (``refexp.tasks.reward_sum``), with the
verifier then as ``Task.gold_score``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import datasets

from refexp.config import ConfigError, TaskConfig
from refexp.tasks.arithmetic import load_arithmetic, rows_of_ops
from refexp.tasks.chat import chat_rows, configure_chat
from refexp.tasks.fingerprint import task_fingerprint
from refexp.tasks.preference import load_preference
from refexp.tasks.reasoning_gym_splits import gym_splits
from refexp.tasks.reward_sum import BatchReward
from refexp.tasks.rewards import exact_match_reward, gsm8k_reward, load_reward, no_reward
from refexp.tasks.splits import check_lengths, gsm8k_splits, preference_splits, val_split
from refexp.tasks.tokenizer import TextTokenizer, build_char_tokenizer

__all__ = ["Task", "TextTokenizer", "build_task", "task_fingerprint"]


@dataclass
class Task:
    """A built task. ``train``/``eval`` rows: ``prompt``, ``completion`` (demonstration, no EOS),
    ``answer`` (what ``reward`` compares against); for ``preference``, ``prompt``/``chosen``/``rejected``."""

    name: str
    tokenizer: TextTokenizer
    train: datasets.Dataset
    eval: datasets.Dataset
    max_new_tokens: int
    """Generation budget; for SFT and DPO every demonstration (+ EOS) fits in it (checked by ``build_task``)."""
    reward: Callable[[str, str], float]
    """``reward(completion_text, answer) -> float``: the task's own (in [0, 1], never raises on model
    output) or the ``task.reward`` hook."""
    max_prompt_len: int = 64
    """Every prompt (+ BOS) has at most this many tokens (checked by ``build_task``)."""
    preference: Optional[datasets.Dataset] = None
    """``prompt``/``chosen``/``rejected`` text pairs from ``task.preference_path``, when set (for
    ``preference``: ``train``)."""
    val: Optional[datasets.Dataset] = None
    """Validation rows (``task.val_path`` or ``task.val_fraction``, see ``refexp.tasks.splits``), same
    columns as ``train``; None when neither is set."""
    sft_train: Optional[datasets.Dataset] = None
    """The SFT stage's demonstrations: every skill it teaches (the embedded task's ``task.ops``), of which
    ``train`` holds the RL skills' (``task.rl_ops``); None = ``train`` (``demonstrations``)."""
    sft_val: Optional[datasets.Dataset] = None
    """The SFT stage's validation rows (its stop rule), every skill; None = ``val``."""
    retain_eval: Optional[datasets.Dataset] = None
    """Held-out rows of the skills the SFT stage teaches and RL does not train (``task.ops`` minus
    ``task.rl_ops``): ``eval/retention``. None when RL trains every skill; ``eval`` holds the RL skills' rows."""
    retain_val: Optional[datasets.Dataset] = None
    """The same from the validation split: ``val/retention``."""

    @property
    def demonstrations(self) -> datasets.Dataset:
        """What the SFT stage trains on: ``sft_train``, else ``train``."""
        return self.train if self.sft_train is None else self.sft_train

    @property
    def sft_validation(self) -> Optional[datasets.Dataset]:
        """What the SFT stage's stop rule reads: ``sft_val``, else ``val``."""
        return self.val if self.sft_val is None else self.sft_val

    optimised: Optional[BatchReward] = None
    """The reward GRPO optimises when it is more than ``reward`` (``task.reward_model``, ``task.reward_funcs``;
    a copy of the built task made by ``refexp.tasks.reward_sum.with_rewards``); None: ``reward``."""
    gold: Optional[BatchReward] = None
    """The gold reward logged beside an ``optimised`` one (``task.gold_reward_model``, else ``reward``); None when
    the verifier is what is optimised."""

    def score(self, texts: list[str], answers: list[str], prompts: list[str]) -> list[float]:
        """The optimised reward of each completion (``optimised``, else ``verify``)."""
        if self.optimised is not None:
            return self.optimised(prompts, texts, answers)
        return self.verify(texts, answers, prompts)

    def gold_score(self, texts: list[str], answers: list[str], prompts: list[str]) -> Optional[list[float]]:
        """The gold reward of each completion, None when the task logs none (``gold``)."""
        return None if self.gold is None else self.gold(prompts, texts, answers)

    def verify_batch(self, prompts: list[str], texts: list[str], answers: list[str]) -> list[float]:
        """``verify`` as a ``BatchReward`` (the verifier among ``task.reward_funcs``, or the gold)."""
        return self.verify(texts, answers, prompts)

    def verify(self, texts: list[str], answers: list[str], prompts: list[str]) -> list[float]:
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


def build_task(task_cfg: TaskConfig, cache_dir: str, *, algo: str = "sft", max_seq_len: int | None = None,
               new_tokens: tuple[str, int] | None = None) -> Task:
    """Load or generate the task of ``task_cfg``. Generated data goes under ``cache_dir/data``;
    ``datasets``' Arrow copies of files and Hub downloads under ``cache_dir/hf-datasets``. ``algo``
    (``algo.name``) decides whether the reference answers must fit ``task.max_new_tokens``
    (``refexp.tasks.splits.TARGET_ALGOS``); ``max_seq_len`` (``model.max_seq_len``) and ``new_tokens``
    (``refexp.config.root.generation_budget``) whether the longest prompt + generation fits the model. Learned rewards
    (``task.reward_model`` & co.) are GRPO's: its entry scores with a copy, ``refexp.tasks.reward_sum.with_rewards``."""
    tokenizer = _tokenizer(task_cfg)
    configure_chat(tokenizer, task_cfg)
    hf_cache = os.path.join(cache_dir, "hf-datasets")
    retained: dict[str, Optional[datasets.Dataset]] = {}  # reasoning_gym's retained datasets' rows, rendered
    if task_cfg.name == "arithmetic":
        splits = load_arithmetic(task_cfg, os.path.join(cache_dir, "data"))
        train, held_out, reward = splits["train"], splits["test"], exact_match_reward
    elif task_cfg.name == "gsm8k":
        train, held_out = gsm8k_splits(task_cfg, hf_cache)
        reward = gsm8k_reward
    elif task_cfg.name == "preference":  # pairs rendered as they load (refexp.tasks.preference)
        train, held_out = preference_splits(task_cfg, tokenizer, hf_cache)
        reward = no_reward
    elif task_cfg.name == "reasoning_gym":  # prompts rendered as they are drawn, the retained datasets' too
        train, held_out, val, retained, reward = gym_splits(task_cfg, tokenizer, hf_cache)
    else:  # TaskConfig.__post_init__ already rejects other names
        raise ConfigError(f"task.name={task_cfg.name!r} is invalid: expected one of arithmetic, gsm8k, preference, "
                          f"reasoning_gym")
    if task_cfg.name != "reasoning_gym":  # which carves its validation split itself
        train, val = val_split(task_cfg, train, hf_cache)
    skills = _skill_splits(task_cfg, train, held_out, val)
    # Before the length checks, which count the rendered prompts. Preference and reasoning-gym prompts are rendered
    # as they load.
    if task_cfg.chat_template and task_cfg.name not in ("preference", "reasoning_gym"):
        train, held_out, val = (None if ds is None else chat_rows(ds, tokenizer, task_cfg.name)
                                for ds in (train, held_out, val))
        skills = {k: None if ds is None else chat_rows(ds, tokenizer, task_cfg.name) for k, ds in skills.items()}
    if task_cfg.reward is not None:
        reward = load_reward(task_cfg.reward)
    measured = {"train": train, "eval": held_out, "val": val, **retained}
    check_lengths(task_cfg, tokenizer, {k: ds for k, ds in measured.items() if ds is not None},
                  algo, max_seq_len=max_seq_len, new_tokens=new_tokens)
    if skills:  # every skill's rows above; the RL stage reads only its own skills' in train / val / eval
        sft_train, sft_val = train, val
        train, held_out, val = skills.pop("train"), skills.pop("eval"), skills.pop("val")
        skills.update(sft_train=sft_train, sft_val=sft_val)
    preference = train if task_cfg.name == "preference" else None
    if preference is None and task_cfg.preference_path is not None:
        preference = load_preference(
            task_cfg.preference_path, tokenizer, split=task_cfg.train_split, config=task_cfg.dataset_config,
            columns=(task_cfg.prompt_column, task_cfg.chosen_column, task_cfg.rejected_column), cache_dir=hf_cache)
    return Task(
        name=task_cfg.name,
        tokenizer=tokenizer,
        train=train,
        eval=held_out,
        max_new_tokens=task_cfg.max_new_tokens,
        reward=reward,
        max_prompt_len=task_cfg.max_prompt_len,
        preference=preference,
        val=val,
        **skills,
        **retained,
    )


def _skill_splits(task_cfg: TaskConfig, train: datasets.Dataset, held_out: datasets.Dataset,
                  val: Optional[datasets.Dataset]) -> dict[str, Optional[datasets.Dataset]]:
    """The embedded task's rows by skill when RL trains fewer than the SFT stage teaches (``task.rl_ops`` a strict
    subset of ``task.ops``): ``train`` / ``eval`` / ``val`` of the RL skills, ``retain_eval`` / ``retain_val`` of
    the others; {} otherwise (every split serves both stages)."""
    retained = task_cfg.retained_ops()
    if not retained:
        return {}
    d = task_cfg.digits
    return {"train": rows_of_ops(train, task_cfg.rl_ops, d), "eval": rows_of_ops(held_out, task_cfg.rl_ops, d),
            "val": None if val is None else rows_of_ops(val, task_cfg.rl_ops, d),
            "retain_eval": rows_of_ops(held_out, retained, d),
            "retain_val": None if val is None else rows_of_ops(val, retained, d)}


def _tokenizer(task_cfg: TaskConfig) -> TextTokenizer:
    if task_cfg.tokenizer_path is not None:
        return TextTokenizer.from_dir(task_cfg.tokenizer_path)
    if task_cfg.name == "arithmetic":
        return build_char_tokenizer()
    raise ConfigError(
        f"task.tokenizer_path=None is invalid for task.name={task_cfg.name}: expected an HF checkpoint "
        f"directory with tokenizer.json (the character tokenizer only covers the arithmetic task)"
    )
