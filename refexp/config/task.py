"""The ``task/`` group: where prompts, answers and the verifiable reward come from."""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Optional

from refexp.choices import ARITHMETIC_OPS

from .errors import check, one_of, positive_int

TASK_NAMES = ("arithmetic", "gsm8k", "preference", "reasoning_gym")
"""The ``task/`` options' names."""
GENERATED_TASKS = ("arithmetic", "reasoning_gym")
"""Tasks that generate their problems (no data files); they carve a validation split by default."""
GYM_FIELDS = ("dataset", "dataset_kwargs", "retention_datasets", "answer_prefill")
"""The fields only ``task=reasoning_gym`` reads."""
DEFAULT_VAL_FRACTION = 0.025
"""The embedded task's validation share: 500 of its 20,000 generated training problems."""


@dataclass
class TaskConfig:
    """Where prompts, answers and the verifiable reward come from. The defaults are the embedded
    arithmetic task (``task/arithmetic.yaml``); ``task/gsm8k.yaml`` and ``task/preference.yaml`` set the
    real-data fields, ``task/reasoning_gym.yaml`` the reasoning-gym ones."""

    name: str = "arithmetic"
    """arithmetic (embedded, generated) | gsm8k (data of the GSM8K schema: question + worked solution) |
    preference (only preference pairs from ``preference_path``: no reward, no verifier; DPO-family only) |
    reasoning_gym (a reasoning-gym dataset, generated, scored by its own verifier; the optional extra
    ``pip install -e '.[gym]'``; ``refexp/tasks/reasoning_gym.py``)."""
    digits: int = 3
    """arithmetic: digits of each (zero-padded) operand."""
    ops: list[str] = field(default_factory=lambda: ["+", "-"])
    """arithmetic: the skills the SFT stage learns, operators of ``ArithmeticOp`` (+, -, *; ``-`` with a
    non-negative result); the problems split evenly over them. The SFT demonstrations and its validation rows mix
    them all."""
    rl_ops: list[str] = field(default_factory=lambda: ["+"])
    """arithmetic: the skills the RL stage trains, a subset of ``ops``: GRPO's prompts, DPO's pair prompts,
    ``eval/accuracy`` and ``val/accuracy`` come from these operators' problems only; the others' held-out problems
    measure what RL keeps of the SFT stage (``eval/retention``, ``val/retention``)."""
    num_train: int = 20000
    """arithmetic, reasoning_gym: generated training problems (the validation split is carved off them)."""
    num_eval: int = 500
    """Held-out problems (split off the training file when ``eval_path`` is None); for ``preference``, held-out
    pairs split off ``preference_path`` (seeded by ``data_seed``) when ``eval_path`` is None."""
    data_seed: int = 1234
    """Seeds problem generation and the held-out split."""
    train_path: Optional[str] = None
    """What ``datasets.load_dataset`` accepts: a local .jsonl/.json/.parquet/.csv file, a folder
    (``save_to_disk``'s or a data dir) or a Hugging Face Hub id (``openai/gsm8k``; needs a network)."""
    eval_path: Optional[str] = None
    """Held-out data, any form ``train_path`` takes (None: split ``num_eval`` rows off ``train_path``, or off
    ``preference_path`` for ``preference``, whose held-out data is a preference file of the same format)."""
    val_path: Optional[str] = None
    """Validation data (e.g. for SFT stopping), any form ``train_path`` takes; excludes ``val_fraction``."""
    val_fraction: Optional[float] = None
    """Share of the training rows carved off (seeded by ``data_seed``) as ``Task.val``, the split that SFT
    stopping and model selection read (never the held-out test split). None = the task's default:
    ``DEFAULT_VAL_FRACTION`` for the generated tasks, arithmetic and reasoning_gym (three splits out of the box),
    none for a data file (set ``val_path`` or a share) and for ``preference``; 0 = no validation split."""
    demo_slip: float = 0.0
    """arithmetic ``+``: the share of training demonstrations of sums whose ones column carries that forget
    that carry in the tens digit (``018+025=0033``), a systematic demonstrator error on the same problems
    at every run (seeded by ``data_seed``). Only SFT's demonstrations carry it: the reward, DPO's chosen side and
    the validation/test answers stay correct, so continued SFT converges to the slip while a verifiable
    reward can go beyond it (``docs/headroom-task.md``)."""
    dataset: Optional[str] = None
    """reasoning_gym: the dataset RL trains on, a name ``reasoning_gym.create_dataset`` knows (``basic_arithmetic``,
    ``chain_sum``, ``leg_counting``, ...)."""
    dataset_kwargs: dict[str, Any] = field(default_factory=dict)
    """reasoning_gym: the dataset's config fields (``create_dataset(dataset, **dataset_kwargs)``, e.g.
    ``{max_terms: 2, max_digits: 1}``; its ``seed`` and ``size`` come from ``data_seed``, ``num_train``,
    ``num_eval``); empty = the dataset's defaults."""
    retention_datasets: list[Any] = field(default_factory=list)
    """reasoning_gym: datasets RL does not train, whose held-out rows measure what RL keeps of the start
    (``eval/retention``, ``val/retention``, ``kl/init_retain``): each a name or ``{name: NAME, <config fields>}``;
    ``num_eval`` rows split evenly over them (a dataset holding fewer distinct questions than its share of those and
    of the retained validation rows gives what it holds, in that proportion). Empty = no retention measured."""
    answer_prefill: str = ""
    """reasoning_gym: text written at the start of the assistant's turn, after the prompt (``<answer>``: the model
    starts inside the tags the reward reads, which SmolLM2-135M-Instruct never writes on its own); the reward reads
    it + the completion. Empty = none (the model writes the whole answer)."""
    preference_path: Optional[str] = None
    """DPO on a preference dataset (any form ``train_path`` takes): prompt/chosen/rejected strings or chat
    ``messages``."""
    dataset_config: Optional[str] = None
    """The config name of a Hub dataset (``main`` for openai/gsm8k); None = its default."""
    train_split: str = "train"
    """The split of ``train_path`` (and ``preference_path``) used when it has several."""
    eval_split: str = "test"
    """The split of ``eval_path`` used when it has several."""
    val_split: str = "validation"
    """The split of ``val_path`` used when it has several."""
    question_column: str = "question"
    """GSM8K-format data: the column holding the question."""
    answer_column: str = "answer"
    """GSM8K-format data: the column holding the worked solution ending in ``#### <number>``."""
    prompt_column: str = "prompt"
    """Preference data: the prompt column (text or chat messages)."""
    chosen_column: str = "chosen"
    """Preference data: the preferred completion column."""
    rejected_column: str = "rejected"
    """Preference data: the dispreferred completion column."""
    reward: Optional[str] = None
    """A reward function ``(completion: str, answer: str) -> float`` by dotted path
    (``package.module:function`` or ``package.module.function``), imported when the config is
    validated; None = the task's own (exact integer match for arithmetic, the final number for gsm8k)."""
    reward_model: Optional[str] = None
    """A learned reward as the optimised reward: a local HF checkpoint dir of an ``AutoModelForSequenceClassification``
    with ``num_labels=1`` and its tokenizer, scoring prompt + completion (through its chat template when it has one
    and ``task.chat_template=false``), or ``rm``: the reward-model stage's (the root ``rm`` block, trained on the SFT
    model's verifier-labelled samples, cached). The task's verifier then becomes the gold reward (``reward/gold``,
    ``eval/gold``). GRPO only; docs/reward-models.md."""
    reward_funcs: list[str] = field(default_factory=list)
    """Several rewards summed with ``reward_weights`` (TRL's ``reward_funcs``): each ``verifier`` (the task's own
    reward, or ``task.reward``), a reward model (``rm``, or a dir: a path with ``/``), or a function by dotted path,
    as ``task.reward`` takes. Empty = one reward (``reward_model``, else the verifier). GRPO only."""
    reward_weights: list[float] = field(default_factory=list)
    """One weight per ``reward_funcs`` entry (TRL's ``reward_weights``); empty = 1 each."""
    gold_reward_model: Optional[str] = None
    """A second reward model dir logged as the gold reward (``reward/gold``, ``eval/gold``) in place of the task's
    verifier; never optimised. GRPO only."""
    reward_model_dtype: str = "float32"
    """float32 | bfloat16: the dtype the reward models are loaded and score in."""
    reward_model_batch_size: int = 64
    """Completions scored per reward-model forward."""
    reward_model_offload: bool = False
    """Keep the reward models in host memory between scorings, moved to the trainer's device for each (frees
    their device memory for policy and reference during the update)."""
    tokenizer_path: Optional[str] = None
    """HF tokenizer dir (tokenizer.json); None = refexp's character tokenizer for the embedded task."""
    chat_template: bool = False
    """Render every prompt (GRPO, evaluation, DPO) with the tokenizer's own chat template, the question as
    the user message and the assistant turn opened (``apply_chat_template(add_generation_prompt=True)``);
    false = the task's plain format (``Question: ...\nAnswer:`` for gsm8k)."""
    system_prompt: Optional[str] = None
    """With ``chat_template``: a leading system message of every prompt; None = none (reasoning_gym: None =
    reasoning-gym's default system prompt, which asks for ``<answer>...</answer>``; "" = none)."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """With ``chat_template``: extra variables of the template (``{enable_thinking: false}`` for Qwen3; on the
    command line a new key takes Hydra's ``+``: ``+task.chat_template_kwargs.enable_thinking=false``)."""
    max_prompt_len: int = 64
    """Prompts longer than this (in tokens) are rejected when the task is built."""
    max_new_tokens: int = 6
    """Generation budget; 6 fits a 3-digit sum's 4 digits + EOS with one token to spare."""

    def __post_init__(self) -> None:
        one_of("task.name", self.name, TASK_NAMES)
        positive_int("task.digits", self.digits)
        for name in ("ops", "rl_ops"):
            ops = getattr(self, name)
            check(isinstance(ops, (list, tuple)) and len(ops) > 0, f"task.{name}", ops,
                  "a non-empty list of operators (" + ", ".join(ARITHMETIC_OPS) + ")")
            for op in ops:
                one_of(f"task.{name}[]", op, ARITHMETIC_OPS)
        if self.name == "arithmetic":  # another task refuses both fields unless left at their defaults
            check(set(self.rl_ops) <= set(self.ops), "task.rl_ops", list(self.rl_ops),
                  f"a subset of task.ops={list(self.ops)!r} (RL trains skills the SFT stage taught)")
        positive_int("task.num_train", self.num_train)
        positive_int("task.num_eval", self.num_eval)
        positive_int("task.max_prompt_len", self.max_prompt_len)
        positive_int("task.max_new_tokens", self.max_new_tokens)
        check(self.val_fraction is None or (isinstance(self.val_fraction, (int, float)) and 0 <= self.val_fraction < 1),
              "task.val_fraction", self.val_fraction, "None (the task's default) or a number in [0, 1)")
        if self.name == "reasoning_gym":
            self._check_gym()
        check(isinstance(self.demo_slip, (int, float)) and 0 <= self.demo_slip <= 1, "task.demo_slip",
              self.demo_slip, "a number in [0, 1]")
        check(not self.demo_slip or (self.name == "arithmetic" and "+" in self.ops), "task.demo_slip",
              self.demo_slip, "0 unless task.name=arithmetic with '+' in task.ops (it drops a carry of a sum)")
        check(not (self.val_path and self.val_fraction), "task.val_fraction", self.val_fraction,
              "None or 0 when task.val_path is set (one validation source)")
        for name in ("train_split", "eval_split", "val_split", "question_column", "answer_column",
                     "prompt_column", "chosen_column", "rejected_column"):
            check(isinstance(getattr(self, name), str) and getattr(self, name) != "", f"task.{name}",
                  getattr(self, name), "a non-empty name")
        for name in ("system_prompt", "chat_template_kwargs"):  # silently unused otherwise
            check(self.chat_template or not getattr(self, name), f"task.{name}", getattr(self, name),
                  "unset unless task.chat_template=true")
        self._check_reward_models()
        if self.name == "gsm8k":
            check(self.train_path is not None, "task.train_path", self.train_path,
                  "GSM8K-format data (a local file or folder, or a Hub id) when task.name=gsm8k")
        if self.name == "preference":
            self._check_preference()
        self._check_ignored()

    def retained_ops(self) -> list[str]:
        """The skills the SFT stage teaches and RL does not train (``ops`` minus ``rl_ops``, in order), whose
        held-out problems ``eval/retention`` measures; [] for a task other than the embedded one."""
        if self.name != "arithmetic":
            return []
        return [op for op in dict.fromkeys(self.ops) if op not in self.rl_ops]

    def learned_rewards(self) -> bool:
        """Whether the optimised reward is other than the verifier alone (``reward_model`` or ``reward_funcs``), or a
        gold reward model is named: then the gold reward is logged beside it (``refexp.tasks.reward_sum``)."""
        return bool(self.reward_model or self.reward_funcs or self.gold_reward_model)

    def _check_reward_models(self) -> None:
        """The reward fields' shapes; what a reward model dir holds is checked by ``refexp.tasks.sources``."""
        one_of("task.reward_model_dtype", self.reward_model_dtype, ("float32", "bfloat16"))
        positive_int("task.reward_model_batch_size", self.reward_model_batch_size)
        check(not (self.reward_model and self.reward_funcs), "task.reward_funcs", self.reward_funcs,
              "empty when task.reward_model is set (list the model among task.reward_funcs instead)")
        for f in self.reward_funcs:
            check(isinstance(f, str) and f != "", "task.reward_funcs[]", f,
                  "verifier, a reward model dir or a function's dotted path")
        check(not self.reward_weights or len(self.reward_weights) == len(self.reward_funcs), "task.reward_weights",
              self.reward_weights, f"empty or one weight per task.reward_funcs entry ({len(self.reward_funcs)})")
        for w in self.reward_weights:
            check(isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w), "task.reward_weights[]",
                  w, "a finite number")

    def val_share(self) -> float:
        """The share of training rows carved off as validation: ``val_fraction``, else the task's default
        (0 with a ``val_path``, which is the validation split itself)."""
        if self.val_fraction is not None:
            return float(self.val_fraction)
        return DEFAULT_VAL_FRACTION if self.name in GENERATED_TASKS and self.val_path is None else 0.0

    def embedded_prompt_tokens(self) -> Optional[int]:
        """The token count of every prompt of the embedded task (``042+317=``: two operands of ``digits``,
        an operator, ``=``, one character a token, and BOS), known from the config alone; None when the
        prompts are read from data, or tokenized or templated otherwise (known once the task is built)."""
        if self.name != "arithmetic" or self.tokenizer_path is not None or self.chat_template:
            return None
        return 2 * self.digits + 2 + 1

    def has_validation(self) -> bool:
        """Whether the task has a validation split (``Task.val``): ``val_path``, or a non-zero ``val_share()``."""
        return self.val_path is not None or bool(self.val_share())

    def _check_gym(self) -> None:
        """The reasoning-gym fields' shapes; the names and configs are checked against the library when the task is
        built (``refexp.tasks.reasoning_gym.create``)."""
        check(isinstance(self.dataset, str) and self.dataset != "", "task.dataset", self.dataset,
              "a reasoning-gym dataset name (e.g. basic_arithmetic) when task.name=reasoning_gym")
        check(isinstance(self.dataset_kwargs, dict), "task.dataset_kwargs", self.dataset_kwargs,
              "a mapping of the dataset's config fields")
        check(isinstance(self.answer_prefill, str), "task.answer_prefill", self.answer_prefill, "text ('' for none)")
        names = []
        for spec in self.retention_datasets:
            name = spec if isinstance(spec, str) else spec.get("name") if isinstance(spec, dict) else None
            check(isinstance(name, str) and name != "", "task.retention_datasets[]", spec,
                  "a dataset name or a mapping {name: NAME, <config fields>}")
            check(name != self.dataset, "task.retention_datasets[]", spec,
                  f"a dataset other than task.dataset={self.dataset!r} (retention measures what RL does not train)")
            names.append(name)
        check(len(set(names)) == len(names), "task.retention_datasets", list(self.retention_datasets),
              "each dataset once")

    def _check_preference(self) -> None:
        """``preference`` reads pairs only: a field for questions, answers or their reward would be silently unused."""
        check(self.preference_path is not None, "task.preference_path", self.preference_path,
              "a preference dataset (a local file or folder, or a Hub id) when task.name=preference")
        for name in ("train_path", "val_path", "reward", "reward_model", "gold_reward_model"):
            check(getattr(self, name) is None, f"task.{name}", getattr(self, name),
                  "None when task.name=preference (pairs come from task.preference_path; there is no reward)")
        check(not self.val_fraction, "task.val_fraction", self.val_fraction,
              "None or 0 when task.name=preference (held-out pairs: task.eval_path, else task.num_eval pairs)")

    def _ignored(self) -> dict[str, str]:
        """The fields this task does not read, each with why (``ignored_fields``)."""
        return ignored_fields(self.name, self.preference_path)

    def _check_ignored(self) -> None:
        """A field this task does not read (``_ignored``) left at its default: set, it would be silently unused."""
        defaults = {f.name: f.default if f.default is not MISSING else f.default_factory() for f in fields(self)}
        for name, why in self._ignored().items():
            value = getattr(self, name)
            check(value == defaults[name], f"task.{name}", value,
                  f"{defaults[name]!r} (its default) with task.name={self.name}: {why}")


def ignored_fields(name: str, preference_path: Optional[str]) -> dict[str, str]:
    """The fields of ``task=<name>`` that it does not read, each with why. Not listed: ``num_train`` and ``num_eval``
    beside a data file or ``eval_path`` — sizes that presets set for every task (the tests' TINY)."""
    ignored: dict[str, str] = {}
    if name != "reasoning_gym":
        ignored.update(dict.fromkeys(GYM_FIELDS, "only task=reasoning_gym reads reasoning-gym datasets"))
    if name != "arithmetic":
        ignored.update(dict.fromkeys(("digits", "ops", "rl_ops"),
                                     "only the embedded arithmetic task generates problems"))
    if name != "gsm8k":
        ignored.update(dict.fromkeys(("question_column", "answer_column"), "only GSM8K-format data has them"))
    if name in GENERATED_TASKS:
        ignored.update(dict.fromkeys(("train_path", "eval_path", "val_path", "eval_split", "val_split"),
                                     f"task={name} generates its problems (task.val_fraction sizes its "
                                     "validation split)"))
        if preference_path is None:
            ignored.update(dict.fromkeys(("dataset_config", "train_split"),
                                         "they describe a data file, and this task reads none"))
    if name == "preference":
        ignored["val_split"] = "the preference task has no validation split"
    if name != "preference" and preference_path is None:
        ignored.update(dict.fromkeys(("prompt_column", "chosen_column", "rejected_column"),
                                     "they name the columns of task.preference_path, which is unset"))
    return ignored
