"""From a preference loss's name (``algo.loss_type``, refexp/choices.py) to the loss: the DPO family, SimPO,
ORPO, the NLL-only baseline, and RPO's NLL term on top.

Shapes and conventions: refexp/losses/__init__.py.
"""

from __future__ import annotations

from typing import Protocol

import torch

from refexp.losses.common import Metrics
from refexp.losses.preference import add_nll_term, dpo_loss, nll_only_loss, orpo_loss, simpo_loss


class PreferenceLossSettings(Protocol):
    """What ``preference_loss`` reads of its settings (``config.DPOConfig`` has them all)."""

    loss_type: str
    beta: float
    gamma: float
    lam: float
    label_smoothing: float
    nll_weight: float


def preference_loss(settings: PreferenceLossSettings, pol_c_B: torch.Tensor, pol_r_B: torch.Tensor,
                    len_c_B: torch.Tensor, len_r_B: torch.Tensor, ref_c_B: torch.Tensor | None,
                    ref_r_B: torch.Tensor | None, chosen_nll: torch.Tensor | None) -> tuple[torch.Tensor, Metrics]:
    """The loss of ``settings.loss_type`` on summed policy log-probs [B] of the chosen and rejected completions
    (``len_*``: their token counts [B]; ``ref_*``: the reference's summed log-probs [B], needed by the DPO types
    only), plus RPO's NLL term when ``settings.nll_weight`` > 0. ``chosen_nll`` (the chosen completions'
    token-mean NLL: 0-d, or [B] per-pair parts) is needed by ``orpo``, ``sft`` and the NLL term."""
    s = settings
    if s.loss_type == "sft":  # the NLL-only baseline (TRL's loss_type="sft")
        return nll_only_loss(pol_c_B, pol_r_B, chosen_nll)
    if s.loss_type == "orpo":  # Hong et al. 2024, eq. 6
        return orpo_loss(pol_c_B, pol_r_B, len_c_B, len_r_B, chosen_nll, lam=s.lam)
    if s.loss_type == "simpo":  # Meng et al. 2024, eq. 6
        loss, m = simpo_loss(pol_c_B, pol_r_B, len_c_B, len_r_B, beta=s.beta, gamma=s.gamma,
                             label_smoothing=s.label_smoothing)
    else:
        loss, m = dpo_loss(pol_c_B, pol_r_B, ref_c_B, ref_r_B, beta=s.beta, loss_type=s.loss_type,
                           label_smoothing=s.label_smoothing, chosen_lengths=len_c_B, rejected_lengths=len_r_B)
    return add_nll_term(loss, m, chosen_nll, s.nll_weight) if s.nll_weight > 0 else (loss, m)
