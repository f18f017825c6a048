"""What every loss shares: the metric and shape helpers, and the plain SFT loss.

Conventions (refexp/losses/__init__.py): a loss returns ``(loss, metrics)`` with ``metrics`` mapping
``/``-namespaced names to detached 0-dim tensors.
"""

from __future__ import annotations

import torch

from refexp.losses.kl import compute_dtype, masked_mean

Metrics = dict[str, torch.Tensor]


def metric(x: torch.Tensor) -> torch.Tensor:
    """A detached 0-dim copy of ``x`` (a caller may all-reduce it before ``.item()``)."""
    return x.detach().reshape(())


def check_shape(name: str, x: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {tuple(shape)}")


def sft_loss(logp_BT: torch.Tensor, mask_BT: torch.Tensor) -> tuple[torch.Tensor, Metrics]:
    """Next-token negative log-likelihood, averaged over all target tokens of the batch.

    ``loss = -sum_{(b,t) in mask} logp[b, t] / |mask|`` (token-weighted, like
    ``F.cross_entropy(..., ignore_index=-100)`` over the flattened batch; 0 for an empty mask).

    Args:
        logp_BT: [B, T] log-probs of the target tokens under the model.
        mask_BT: [B, T] target tokens (completion, not prompt or padding).

    Metrics: ``loss/sft``, ``loss/total`` (the same value).
    """
    loss = -masked_mean(compute_dtype(logp_BT), mask_BT)
    return loss, {"loss/sft": metric(loss), "loss/total": metric(loss)}
