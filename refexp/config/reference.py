"""The ``reference/`` group: one schema per strategy, each with only its own fields.

``ReferenceConfig`` holds what every strategy has (how the reference model is described); a strategy's
subclass adds its own knobs, so ``reference=fixed reference.reset_every=5`` fails instead of being ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

from omegaconf import MISSING

from .errors import check, one_of, positive_int


@dataclass
class ReferenceConfig:
    """Which reference the KL (GRPO) or the implicit reward (DPO) is measured against, and how it moves.

    The reference is described by its own checkpoint / dtype / compile settings, defaulting to the
    policy's (as torchforge's ReferenceModel): a weaker or mismatched reference is worth studying.
    """

    name: str = MISSING
    """One of ``REFERENCE_STRATEGIES`` (refexp/choices.py), set by ``reference=<name>``."""
    checkpoint: Optional[str] = None
    """A different checkpoint dir for the reference (None = the policy's start)."""
    dtype: Optional[str] = None
    """None = training.dtype."""
    compile: Optional[bool] = None
    """None = compile.enable."""
    offload: bool = False
    """Keep the frozen reference (and the kl/init anchor) in host memory between uses, moved to the
    device only for its forwards: device memory for time (one host-to-device copy per use)."""

    def __post_init__(self) -> None:
        # The base instance in RootConfig's default has no strategy yet; to_object rejects it if none is chosen.
        if type(self) is not ReferenceConfig:
            own = strategy_of(type(self))
            check(self.name == own, "reference.name", self.name,
                  f"{own!r} for reference={own} (choose the strategy with reference=<name>, not reference.name)")
        if self.dtype is not None:
            one_of("reference.dtype", self.dtype, ("float32", "bfloat16"))

    def fp32_master_bytes(self, training_dtype: str) -> int:
        """Bytes per parameter of the float32 master copy a gradual (EMA) reference stored in bf16 keeps
        (refexp/reference/strategies.py), 0 for any other: the memory plan (refexp/cli/dry_run.py) adds it to the
        reference's."""
        return 4 if self.name == "ema" and (self.dtype or training_dtype) != "float32" else 0


@dataclass
class FixedReferenceConfig(ReferenceConfig):
    """``reference=fixed``: a frozen copy of the SFT model (or of ``checkpoint``); never changes."""

    name: str = "fixed"
    """Always fixed."""


@dataclass
class PeriodicResetReferenceConfig(ReferenceConfig):
    """``reference=periodic_reset``: the reference becomes the current policy every ``reset_every`` steps
    (TR-DPO's hard update; ProRL)."""

    name: str = "periodic_reset"
    """Always periodic_reset."""
    reset_every: int = 20
    """The reference becomes the current policy every this many steps."""
    reset_optimizer: bool = False
    """Also re-initialise the optimizer state at a reset (ProRL)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        positive_int("reference.reset_every", self.reset_every)


@dataclass
class EMAReferenceConfig(ReferenceConfig):
    """``reference=ema``: every ``sync_every`` steps, ref <- alpha * policy + (1 - alpha) * ref
    (TR-DPO's soft update)."""

    name: str = "ema"
    """Always ema."""
    sync_every: int = 1
    """Update the reference every this many steps."""
    alpha: float = 0.05
    """Weight of the policy in each update (1 is a hard reset). 0.05 every step trails the policy by
    about 1/alpha = 20 steps, as periodic_reset's default reset does."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(0 < self.alpha <= 1, "reference.alpha", self.alpha, "a number in (0, 1]")
        positive_int("reference.sync_every", self.sync_every)


@dataclass
class KLTriggeredReferenceConfig(ReferenceConfig):
    """``reference=kl_triggered``: reset to the policy when kl/ref exceeds ``kl_threshold``, at least
    ``min_gap`` steps after the previous reset. GRPO's kl/ref is the training batch's, every step; DPO's is
    measured on the eval schedule only (refexp/algos/dpo.py), so a DPO reset can happen at eval steps only."""

    name: str = "kl_triggered"
    """Always kl_triggered."""
    kl_threshold: float = 0.02
    """Reset when the batch's kl/ref exceeds this. Calibrated so that a fixed reference's kl/ref crosses it
    at beta=1 on the embedded task (it should fire, but not every step); see docs/compare_refs_grpo/report.md."""
    min_gap: int = 5
    """At least this many steps between two resets (one noisy batch cannot reset twice)."""
    reset_optimizer: bool = False
    """Also re-initialise the optimizer state at a reset (ProRL)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.kl_threshold > 0, "reference.kl_threshold", self.kl_threshold, "a number > 0")
        check(isinstance(self.min_gap, int) and self.min_gap >= 1, "reference.min_gap", self.min_gap,
              "an integer >= 1")


@dataclass
class NoReferenceConfig(ReferenceConfig):
    """``reference=none``: reference-free; no reference model is built or held, no KL term."""

    name: str = "none"
    """Always none."""


def strategy_of(schema: type[ReferenceConfig]) -> str:
    """The strategy a schema describes: the default of its ``name`` field."""
    return next(f.default for f in fields(schema) if f.name == "name")


REFERENCE_SCHEMAS: dict[str, type[ReferenceConfig]] = {
    strategy_of(schema): schema
    for schema in (FixedReferenceConfig, PeriodicResetReferenceConfig, EMAReferenceConfig,
                   KLTriggeredReferenceConfig, NoReferenceConfig)
}
"""``reference=<name>`` -> its schema (registered as ``reference_<name>_schema``); its keys are
``REFERENCE_STRATEGIES`` in that order (tests/test_config_checks.py)."""
