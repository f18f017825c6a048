"""The reference strategies of a LoRA policy (``model.lora``): the same decisions as ``strategies.py`` (when to
reset, when to blend), with the reference kept inside the policy instead of a frozen copy of the model
(``refexp/titan/lora.py``):

- ``fixed``: the base with the adapters off; nothing is built, nothing is saved;
- ``periodic_reset``, ``kl_triggered``: base + a frozen reference adapter, copied from the adapters at each reset;
- ``ema``: base + a dense delta, the running average of the adapters' weight update ``scale * B A`` (float32 master
  beside a bf16 delta, as a full EMA reference keeps one);
- ``none``: unchanged (``NoReference``).

Each is its full-weight strategy exactly (docs/algorithms.md, "LoRA policies"; tests/test_lora_reference.py). The
reference parts are parameters of the policy's layers, so they are checkpointed with the adapters (the policy's
model part, ``titan.AdapterStates``); the strategy's own state is its counters and an EMA's float32 master.
"""

from __future__ import annotations

from typing import Mapping

import torch

from refexp import titan
from refexp.reference.strategies import (
    EMAReference,
    FixedReference,
    KLTriggeredReference,
    NoReference,
    PeriodicResetReference,
    ReferenceStrategy,
    check_schema,
)


class LoRAReference(ReferenceStrategy):
    """Base of the LoRA forms: ``model`` is the policy itself, its reference computed in the ``reference`` view."""

    view = titan.lora.REFERENCE

    def __init__(self, cfg, policy: torch.nn.Module, *, defer_build: bool = False):
        self._policy = policy
        super().__init__(cfg, None, defer_build=defer_build)

    def ensure_model(self) -> torch.nn.Module | None:
        if self.model is None and self.holds_model:
            self.model = self._policy
            if self.gradual:
                self.master = titan.delta_master(self._policy)
        return self.model

    def logprobs(self, tokens_BT: torch.Tensor, **forward_kwargs) -> torch.Tensor | None:
        """[B, T-1] float32 log-probs of the reference: the policy's forward in the ``reference`` view."""
        if self.model is None:
            return None
        with titan.lora_view(self.model, self.view), torch.inference_mode():
            logp = titan.token_logprobs(self.model, tokens_BT, **forward_kwargs)
        return logp.clone()

    def _update(self, step: int, policy: torch.nn.Module, alpha: float) -> None:
        """Move the reference part towards the adapters (a collective under FSDP: every rank updates)."""
        titan.update_reference_(self.model, alpha, self.master)
        self.version += 1
        self.last_update_step = step

    def state_dict(self) -> dict:
        sd = {"version": self.version, "last_update_step": self.last_update_step}
        if self.master is not None:
            sd["master"] = self.master  # the reference part itself is in the policy's checkpointed model part
        return sd

    def load_state_dict(self, sd: Mapping) -> None:
        self.version = int(sd["version"])
        self.last_update_step = int(sd["last_update_step"])
        if self.master is not None:
            if "master" in sd:
                for name, t in self.master.items():
                    t.copy_(sd["master"][name])
            else:  # saved without one (checkpoint.save_reference=false before the first move): the delta's values
                self.master = titan.delta_master(self.model)


class LoRAFixedReference(LoRAReference, FixedReference):
    """The start model as the base with the adapters off: no copy, and the kl/init anchor is the same view."""

    view = titan.lora.BASE


class LoRAPeriodicResetReference(LoRAReference, PeriodicResetReference):
    """Base + a reference adapter, set to the adapters every ``reset_every`` steps."""


class LoRAKLTriggeredReference(LoRAReference, KLTriggeredReference):
    """Base + a reference adapter, set to the adapters when ``kl/ref`` crosses ``kl_threshold``."""


class LoRAEMAReference(LoRAReference, EMAReference):
    """Base + the running average of the adapters' weight update, a dense delta per adapted layer."""


LORA_REGISTRY: dict[str, type[ReferenceStrategy]] = {
    cls.name: cls for cls in (LoRAFixedReference, LoRAPeriodicResetReference, LoRAEMAReference,
                              LoRAKLTriggeredReference, NoReference)
}
"""``reference.name`` -> its strategy for a LoRA policy; the same keys as ``strategies.REGISTRY``."""


def build_lora_reference(cfg, policy: torch.nn.Module, *, defer_build: bool = False) -> ReferenceStrategy:
    """The strategy ``reference.name`` of a LoRA ``policy`` (built with its reference part:
    ``config.model.LORA_REFERENCE_STATE``)."""
    check_schema(cfg)
    cls = LORA_REGISTRY[cfg.name]
    if cls is NoReference:
        return NoReference(cfg, None, defer_build=defer_build)
    return cls(cfg, policy, defer_build=defer_build)
