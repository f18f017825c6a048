"""The kl/init anchor: the frozen initial (SFT) model ``kl/init`` is measured against (``refexp/components/evaluation.py``
measures; this holds the model).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

import torch

from refexp import titan
from refexp.reference.offload import model_device, on_device, park_on_host


class InitAnchor:
    """The frozen initial (SFT) model that ``kl/init`` is measured against.

    With ``reference=fixed`` on the start checkpoint it *is* the reference (``shared``, no second
    copy). Otherwise ``build_frozen()`` makes it at the first measurement and it is kept for the run,
    never rebuilt from disk; with ``offload`` (``reference.offload``) it waits in host memory between
    measurements and is lent to the compute device for each (``refexp/reference/offload.py``).
    """

    def __init__(self, build_frozen: Callable[[], torch.nn.Module], shared=None, *, offload: bool = False):
        self.build_frozen, self.shared, self.offload = build_frozen, shared, offload
        self.model: torch.nn.Module | None = None
        self._device: torch.device | None = None  # where an offloaded anchor computes

    def _ensure_model(self) -> torch.nn.Module:
        if self.model is None:
            self.model = self.build_frozen()
            if self.offload:
                self._device = model_device(self.model)
                park_on_host(self.model)
        return self.model

    @contextmanager
    def logprobs(self):
        """``with anchor.logprobs() as fn:`` ``fn(tokens_BT, **kwargs) -> [B, T-1]`` log-probs under the
        initial model (kwargs: ``titan.token_logprobs``'s ``temperature``, positions, attention mask)."""
        if self.shared is not None and self.shared.model is not None:  # None: released (DPO's cache)
            yield self.shared.logprobs
            return
        model = self._ensure_model()

        def fn(tokens_BT, **kwargs):
            with torch.inference_mode():
                return titan.token_logprobs(model, tokens_BT, **kwargs).clone()

        with on_device(model, self._device):
            yield fn
