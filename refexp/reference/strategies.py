"""Reference strategies: what the KL (GRPO) or the implicit reward (DPO) is measured against.

One small protocol, one class per strategy, a registry keyed by the ``reference/`` config group.
A hard reset and an EMA update are the same operation, ref <- alpha*policy + (1-alpha)*ref, with
alpha=1 and alpha<1 (TR-DPO, Gorbatovski et al. 2024, eq. 6-7). Each strategy owns its state
(``version``, ``last_update_step``), reports it as ``ref/version`` / ``ref/last_update_step``, and
checkpoints it together with its weights when they can differ from the start checkpoint.

``reference.offload``: the frozen model lives in host memory (``refexp/reference/offload.py``) and is lent to the
compute device for its forwards, never copied back; an update blends the policy's shards into the host copy
itself. The kl/init anchor (``refexp/reference/anchor.py``) is offloaded likewise.

Precision: an EMA reference stored in bf16 (``reference.dtype`` or ``training.dtype=bfloat16``) keeps a float32
master copy (``titan.fp32_master``) that the updates accumulate in, the bf16 model cast from it after each
(``ReferenceConfig.fp32_master_bytes``: 4 bytes per parameter more, on the device unless offloaded, where it
stays in host memory). A bf16 EMA without it stalls: an element moves only when alpha times its distance
to the policy reaches half a bf16 ulp. Hard resets are exact copies and need none.

Steps are 1-based optimizer steps: ``after_step(step=k)`` runs after the k-th update, so with
``reset_every=3`` the reference changes at steps 3, 6, ... and the batch of step 4 is sampled from
exactly the reference's weights (kl/ref = 0).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Mapping

import torch

from refexp import titan
from refexp.choices import MOVING_STRATEGIES
from refexp.config import (
    REFERENCE_SCHEMAS,
    ConfigError,
    EMAReferenceConfig,
    KLTriggeredReferenceConfig,
    PeriodicResetReferenceConfig,
    ReferenceConfig,
)
from refexp.reference.offload import build_parked, on_device


class ReferenceStrategy:
    """Base: holds (or not) a frozen reference model and updates it by ``_update``; with
    ``reference.offload`` the model stays in host memory between uses."""

    name = "base"
    holds_model = True
    gradual = False
    """Whether updates blend (alpha < 1): such a strategy keeps an fp32 master of a bf16 model."""

    def __init__(self, cfg: ReferenceConfig, build_frozen: Callable[[], torch.nn.Module] | None, *,
                 defer_build: bool = False):
        self.cfg = cfg
        self.version = 0
        self.last_update_step = 0
        self.reset_optimizer_requested = False
        self._build_frozen = build_frozen
        self.model = None
        self._device: torch.device | None = None  # where an offloaded model computes
        self._resident = False  # inside ``resident()``: on its device
        self.master: dict[str, torch.Tensor] | None = None  # fp32 accumulator of a gradual bf16 reference
        if not defer_build:
            self.ensure_model()

    # -------------------------------------------------------------- the frozen model's lifetime
    def ensure_model(self) -> torch.nn.Module | None:
        """Build the frozen model if this strategy holds one and has none yet (after ``defer_build``)."""
        if self.model is None and self.holds_model and self._build_frozen is not None:
            self.model, self._device = build_parked(self._build_frozen, offload=self.cfg.offload)
            if self.gradual and any(p.is_floating_point() and p.dtype != torch.float32
                                    for p in self.model.parameters()):
                self.master = titan.fp32_master(self.model)  # where the model is: host memory when offloaded
        return self.model

    def release_model(self) -> None:
        """Free the frozen model of a reference that never moves (DPO with every reference log-prob
        cached needs no model); ``ensure_model`` builds it again."""
        if self.moves:
            raise RuntimeError(f"reference={self.name} moves: its weights are state and cannot be released")
        self.model = None
        self.master = None

    # -------------------------------------------------------------- queries
    @property
    def moves(self) -> bool:
        """Whether the reference's weights can change during training (refexp/choices.py)."""
        return self.name in MOVING_STRATEGIES

    def logprobs(self, tokens_BT: torch.Tensor, **forward_kwargs) -> torch.Tensor | None:
        """[B, T-1] float32 reference log-probs of ``tokens_BT`` (None when reference-free).
        ``forward_kwargs``: ``titan.token_logprobs``'s positions / attention mask."""
        if self.model is None:
            return None
        with self.resident(), torch.inference_mode():
            logp = titan.token_logprobs(self.model, tokens_BT, **forward_kwargs)
        return logp.clone()

    @contextmanager
    def resident(self):
        """Within the block an offloaded model stays on its device (one move for several forwards, e.g.
        a step's micro-batches); nested blocks do not move it again."""
        if self._resident or self._device is None:
            yield
            return
        self._resident = True
        try:
            with on_device(self.model, self._device):
                yield
        finally:
            self._resident = False  # an ordinary tensor: inference tensors cannot enter autograd

    def metrics(self) -> dict[str, float]:
        return {"ref/version": float(self.version), "ref/last_update_step": float(self.last_update_step)}

    # -------------------------------------------------------------- updates
    def after_step(self, step: int, policy: torch.nn.Module, metrics: Mapping[str, float]) -> bool:
        """Maybe move the reference after optimizer step ``step``; True when it changed."""
        return False

    def _update(self, step: int, policy: torch.nn.Module, alpha: float) -> None:
        """Blend the policy into the reference where the reference is kept (its host copy when offloaded:
        the policy's shards come to it, and the reference is never copied back from the device)."""
        if self._resident:
            raise RuntimeError("a reference update inside resident(): its host copy would be stale after it")
        titan.lerp_weights_(self.model, policy, alpha, self.master)
        self.version += 1
        self.last_update_step = step

    # -------------------------------------------------------------- checkpoint (torch Stateful)
    def state_dict(self) -> dict:
        sd = {"version": self.version, "last_update_step": self.last_update_step}
        if self.moves and self.model is not None:
            sd["model"] = self.model.state_dict()
            if self.master is not None:
                sd["master"] = self.master  # resumes the blend exactly (the bf16 model alone has lost its bits)
        return sd

    def load_state_dict(self, sd: Mapping) -> None:
        self.version = int(sd["version"])
        self.last_update_step = int(sd["last_update_step"])
        if "model" in sd and self.model is not None:
            self.model.load_state_dict(sd["model"])
            if self.master is not None:
                if "master" in sd:
                    for name, t in self.master.items():
                        t.copy_(sd["master"][name])
                else:  # saved without one: the model's own values, as at the start
                    self.master = titan.fp32_master(self.model)


class FixedReference(ReferenceStrategy):
    """A frozen copy of the SFT checkpoint (or ``reference.checkpoint``); never changes."""

    name = "fixed"


class PeriodicResetReference(ReferenceStrategy):
    """Every ``reset_every`` steps the reference becomes the current policy (TR-DPO hard update;
    ProRL, Liu et al. 2025, also resets the optimizer when ``reset_optimizer``)."""

    name = "periodic_reset"
    cfg: PeriodicResetReferenceConfig

    def after_step(self, step, policy, metrics) -> bool:
        if step % self.cfg.reset_every != 0:
            return False
        self._update(step, policy, alpha=1.0)
        self.reset_optimizer_requested = self.cfg.reset_optimizer
        return True


class EMAReference(ReferenceStrategy):
    """Every ``sync_every`` steps: ref <- alpha*policy + (1-alpha)*ref (TR-DPO soft update)."""

    name = "ema"
    gradual = True
    cfg: EMAReferenceConfig

    def after_step(self, step, policy, metrics) -> bool:
        if step % self.cfg.sync_every != 0:
            return False
        self._update(step, policy, alpha=self.cfg.alpha)
        return True


class KLTriggeredReference(ReferenceStrategy):
    """Reset to the policy when the batch's ``kl/ref`` exceeds ``kl_threshold``, at least
    ``min_gap`` steps after the previous reset (the gap keeps one noisy batch from resetting twice)."""

    name = "kl_triggered"
    cfg: KLTriggeredReferenceConfig

    def after_step(self, step, policy, metrics) -> bool:
        kl = metrics.get("kl/ref")
        if kl is None or float(kl) <= self.cfg.kl_threshold or step - self.last_update_step < self.cfg.min_gap:
            return False
        self._update(step, policy, alpha=1.0)
        self.reset_optimizer_requested = self.cfg.reset_optimizer
        return True


class NoReference(ReferenceStrategy):
    """Reference-free: no model is built or held; no KL term."""

    name = "none"
    holds_model = False


REGISTRY: dict[str, type[ReferenceStrategy]] = {
    cls.name: cls
    for cls in (FixedReference, PeriodicResetReference, EMAReference, KLTriggeredReference, NoReference)
}
"""``reference.name`` -> its strategy; the keys are ``REFERENCE_STRATEGIES`` (tests/test_config_checks.py)."""


def build_reference(cfg: ReferenceConfig, build_frozen: Callable[[], torch.nn.Module] | None, *,
                    defer_build: bool = False) -> ReferenceStrategy:
    """The strategy named by ``reference.name``; ``build_frozen()`` makes its frozen model (not called for
    none; with ``defer_build`` not before ``ensure_model()``). ``cfg`` is that strategy's own schema
    (``REFERENCE_SCHEMAS[name]``): its fields are the ones the strategy reads."""
    check_schema(cfg)
    return REGISTRY[cfg.name](cfg, build_frozen, defer_build=defer_build)


def check_schema(cfg: ReferenceConfig) -> None:
    """``ConfigError`` unless ``cfg`` is its strategy's own schema (``REFERENCE_SCHEMAS[cfg.name]``)."""
    schema = REFERENCE_SCHEMAS.get(cfg.name)
    if schema is None or not isinstance(cfg, schema):
        raise ConfigError(f"reference.name={cfg.name!r} needs a {schema.__name__ if schema else 'known strategy'} "
                          f"config (got {type(cfg).__name__}): expected one of {', '.join(REFERENCE_SCHEMAS)}")


REFERENCE_SOURCES = ("none", "live", "versioned", "precomputed")


def reference_source(cfg) -> str:
    """Where a run's reference log-probs come from, from its config (a ``RootConfig``) alone: the trainer builds
    by it (``refexp/algos/dpo_reference.py``) and the memory plan counts by it (``refexp/cli/memory_plan.py``).

    ``none``: no reference model (``algo=sft``, or a strategy that holds none); ``live``: a forward each step;
    ``versioned``: DPO's ``algo.precompute_ref`` with a moving reference (a forward once per version);
    ``precomputed``: with a fixed one (read from the table on disk, the model released)."""
    if cfg.algo.name == "sft" or not REGISTRY[cfg.reference.name].holds_model:
        return "none"
    if cfg.algo.name != "dpo" or not cfg.algo.precompute_ref:
        return "live"
    return "versioned" if cfg.reference.name in MOVING_STRATEGIES else "precomputed"
