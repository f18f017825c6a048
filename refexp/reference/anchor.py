"""The kl/init anchor: the frozen initial (SFT) model ``kl/init`` is measured against
(``refexp/components/evaluation.py`` measures; this holds the model).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import torch

from refexp import titan
from refexp.reference.offload import build_parked, on_device


class InitAnchor:
    """The frozen initial (SFT) model that ``kl/init`` is measured against.

    With ``reference=fixed`` on the start checkpoint it *is* the reference (``shared``, no second
    copy). Otherwise ``build_frozen()`` makes it at the first measurement and it is kept for the run,
    never rebuilt from disk; with ``offload`` (``reference.offload``) it waits in host memory between
    measurements and is lent to the compute device for each (``refexp/reference/offload.py``).

    With a LoRA policy (``lora_policy``) the start model is the policy with its adapters off: nothing is built, and
    ``kl/init`` reads the same weights the policy's base holds (none is ever merged into it).
    """

    def __init__(self, build_frozen: Callable[[], torch.nn.Module], shared=None, *, offload: bool = False,
                 lora_policy: torch.nn.Module | None = None):
        self.build_frozen, self.shared, self.offload = build_frozen, shared, offload
        self.lora_policy = lora_policy
        self.model: torch.nn.Module | None = None
        self._device: torch.device | None = None  # where an offloaded anchor computes
        self._lent = False  # within a ``frozen`` block: a nested one does not move the model again

    def _ensure_model(self) -> torch.nn.Module:
        if self.model is None:
            self.model, self._device = build_parked(self.build_frozen, offload=self.offload)
        return self.model

    @contextmanager
    def frozen(self):
        """``with anchor.frozen() as model:`` the initial model itself, on its compute device for the block (an
        offloaded one is lent there once; a nested block does not lend it again): for a measure that reads more
        than the sampled tokens' log-probs (``kl/init_exact``'s whole next-token distributions, ``titan.token_kl``).
        Of a LoRA policy, a ``titan.LoRAView`` of it with the adapters off: enter it with ``titan.viewed``."""
        if self.lora_policy is not None:  # the policy's own module, read with its adapters off (``titan.viewed``)
            yield titan.LoRAView(self.lora_policy, titan.lora.BASE)
            return
        if self.shared is not None and self.shared.model is not None:  # None: released (DPO's cache)
            with self.shared.resident():
                yield self.shared.model
            return
        model = self._ensure_model()
        if self._lent:
            yield model
            return
        self._lent = True
        try:
            with on_device(model, self._device):
                yield model
        finally:
            self._lent = False

    @contextmanager
    def logprobs(self):
        """``with anchor.logprobs() as fn:`` ``fn(tokens_BT, **kwargs) -> [B, T-1]`` log-probs under the
        initial model (kwargs: ``titan.token_logprobs``'s ``temperature``, positions, attention mask)."""
        with self.frozen() as frozen:

            def fn(tokens_BT, **kwargs):
                with titan.viewed(frozen) as model, torch.inference_mode():
                    return titan.token_logprobs(model, tokens_BT, **kwargs).clone()

            yield fn


def reference_start(cfg, init_path: Path) -> Path:
    """The checkpoint the reference starts from: ``reference.checkpoint``, else the policy's start (``init_path``)."""
    return Path(cfg.reference.checkpoint) if cfg.reference.checkpoint else init_path


def anchor_is_reference(cfg, ref_path: Path, init_path: Path) -> bool:
    """Whether the kl/init anchor is the reference itself (``InitAnchor.shared``, no second copy): a fixed
    reference that starts from the policy's start (``ref_path == init_path``) in the training dtype. The trainer
    (``refexp/algos/loop.py``) and the memory plan (``refexp/cli/memory_plan.py``) both ask this."""
    r = cfg.reference
    return r.name == "fixed" and ref_path == init_path and r.dtype in (None, cfg.training.dtype)
