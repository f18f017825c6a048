"""Preference losses on pairs of completions: DPO and its reference-based variants (IPO, robust,
hinge), the reference-free SimPO and ORPO, the NLL-only baseline and RPO's NLL term.

Shapes and conventions: refexp/losses/__init__.py.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from refexp.choices import DPO_LOSS_TYPES
from refexp.losses.common import Metrics, check_shape, metric
from refexp.losses.kl import compute_dtype


def _preference_metrics(
    chosen_rewards: torch.Tensor,
    rejected_rewards: torch.Tensor,
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
) -> Metrics:
    """TRL's ``rewards/*`` and ``logps/*``, under TRL's names."""
    return {
        "rewards/chosen": metric(chosen_rewards.mean()),
        "rewards/rejected": metric(rejected_rewards.mean()),
        "rewards/margins": metric((chosen_rewards - rejected_rewards).mean()),
        "rewards/accuracies": metric((chosen_rewards > rejected_rewards).to(chosen_rewards.dtype).mean()),
        "logps/chosen": metric(chosen_logps.mean()),
        "logps/rejected": metric(rejected_logps.mean()),
    }


def _lengths(name: str, lengths: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    if lengths is None:
        raise ValueError(f"{name} is required")
    n = torch.as_tensor(lengths, device=like.device).to(like.dtype)
    check_shape(name, n, tuple(like.shape))
    if bool((n <= 0).any()):
        raise ValueError(f"{name} must be positive token counts")
    return n


def _smoothed_sigmoid_loss(logits: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """``-logsigmoid(z) (1 - eps) - logsigmoid(-z) eps``: BT loss with labels flipped w.p. eps (cDPO)."""
    return -F.logsigmoid(logits) * (1.0 - label_smoothing) - F.logsigmoid(-logits) * label_smoothing


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    *,
    beta: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
    chosen_lengths: torch.Tensor | None = None,
    rejected_lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """DPO and its reference-based variants; the loss is the mean over the B pairs.

    With ``x = (pi_c - pi_r) - (ref_c - ref_r)`` (log-probs of the chosen/rejected completions)
    and ``eps = label_smoothing``:

    * ``"sigmoid"``: ``-logsigmoid(beta x)(1 - eps) - logsigmoid(-beta x) eps`` (Rafailov et al.
      2023, eq. 7; eps > 0 is conservative DPO, Mitchell 2023),
    * ``"ipo"``: ``(x - 1/(2 beta))^2`` (Azar et al. 2023, arXiv:2310.12036, eq. 17, beta = tau),
    * ``"robust"``: ``(-logsigmoid(beta x)(1 - eps) + logsigmoid(-beta x) eps) / (1 - 2 eps)``
      (Chowdhury et al. 2024, arXiv:2403.00409; unbiased under label noise eps < 1/2),
    * ``"hinge"``: ``relu(1 - beta x)`` (SLiC, Zhao et al. 2023, arXiv:2305.10425).

    **IPO and lengths.** IPO's regression target 1/(2 beta) is meant for per-token average
    log-probs; TRL divides all four log-probs by their completion's token count when
    ``loss_type="ipo"``. Here that happens when ``chosen_lengths`` and ``rejected_lengths`` are given
    (each log-prob by its own completion's length, policy and reference alike); without them the
    inputs are used as given (pass already-averaged log-probs, or accept the summed form). Other
    loss types ignore the lengths, so a caller may always pass them.

    Args:
        policy_chosen_logps, policy_rejected_logps: [B] summed log-probs under the policy.
        ref_chosen_logps, ref_rejected_logps: [B] summed log-probs under the reference (detached
            here).
        beta: > 0.
        chosen_lengths, rejected_lengths: [B] completion token counts (IPO only).

    Metrics (detached 0-dim), TRL's: ``rewards/chosen`` = mean of beta (pi_c - ref_c),
    ``rewards/rejected``, ``rewards/margins`` (mean chosen - rejected reward), ``rewards/accuracies``
    (fraction of pairs with chosen reward strictly greater), ``logps/chosen``, ``logps/rejected``
    (policy, as used in the loss, i.e. averaged for IPO with lengths), ``loss/total``.

    Departures from TRL 1.16: ``"sigmoid"`` with ``label_smoothing > 0`` is conservative DPO (cDPO, the
    form above and of earlier TRL releases); TRL 1.16's sigmoid ignores ``label_smoothing``, so the two agree
    only at ``label_smoothing = 0``. ``label_smoothing != 0`` with ``ipo``/``hinge`` raises (TRL ignores
    it); ``robust`` requires ``0 <= label_smoothing < 1/2`` (TRL checks the same).
    """
    _check_dpo_inputs(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta=beta,
                      loss_type=loss_type, label_smoothing=label_smoothing)
    pc, pr = compute_dtype(policy_chosen_logps), compute_dtype(policy_rejected_logps)
    rc, rr = compute_dtype(ref_chosen_logps.detach()), compute_dtype(ref_rejected_logps.detach())
    if loss_type == "ipo" and (chosen_lengths is not None or rejected_lengths is not None):
        lc = _lengths("chosen_lengths", chosen_lengths, pc)
        lr = _lengths("rejected_lengths", rejected_lengths, pr)
        pc, rc, pr, rr = pc / lc, rc / lc, pr / lr, rr / lr

    x = (pc - pr) - (rc - rr)
    if loss_type == "sigmoid":
        losses = _smoothed_sigmoid_loss(beta * x, label_smoothing)
    elif loss_type == "ipo":
        losses = (x - 1.0 / (2.0 * beta)) ** 2
    elif loss_type == "robust":
        losses = (
            -F.logsigmoid(beta * x) * (1.0 - label_smoothing) + F.logsigmoid(-beta * x) * label_smoothing
        ) / (1.0 - 2.0 * label_smoothing)
    else:
        losses = torch.relu(1.0 - beta * x)
    loss = losses.mean()

    metrics = _preference_metrics(beta * (pc - rc), beta * (pr - rr), pc, pr)
    metrics["loss/total"] = metric(loss)
    return loss, metrics


def _check_dpo_inputs(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, *,
                      beta: float, loss_type: str, label_smoothing: float) -> None:
    """``dpo_loss``'s shape and option checks (ValueError naming the argument)."""
    shape_B = tuple(policy_chosen_logps.shape)
    if len(shape_B) != 1:
        raise ValueError(f"policy_chosen_logps has shape {shape_B}, expected [B]")
    for name, t in (
        ("policy_rejected_logps", policy_rejected_logps),
        ("ref_chosen_logps", ref_chosen_logps),
        ("ref_rejected_logps", ref_rejected_logps),
    ):
        check_shape(name, t, shape_B)
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"loss_type={loss_type!r} is invalid: expected one of {', '.join(DPO_LOSS_TYPES)}")
    if not beta > 0:
        raise ValueError(f"beta={beta!r} is invalid: expected a number > 0")
    if loss_type in ("ipo", "hinge") and label_smoothing != 0.0:
        raise ValueError(
            f"label_smoothing={label_smoothing!r} is invalid: loss_type={loss_type!r} has no label smoothing"
        )
    if loss_type == "robust" and not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing={label_smoothing!r} is invalid: 'robust' needs a number in [0, 0.5)")
    if loss_type == "sigmoid" and not 0.0 <= label_smoothing <= 0.5:
        raise ValueError(f"label_smoothing={label_smoothing!r} is invalid: expected a number in [0, 0.5]")


def simpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    chosen_lengths: torch.Tensor,
    rejected_lengths: torch.Tensor,
    *,
    beta: float,
    gamma: float,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, Metrics]:
    """SimPO (Meng et al. 2024, arXiv:2405.14734, eq. 6): reference-free, length-normalised DPO.

    With ``a = pi_c / |c|`` and ``b = pi_r / |r|`` (average log-prob per token)::

        z = a - b - gamma / beta
        loss = mean( -logsigmoid(beta z)(1 - eps) - logsigmoid(-beta z) eps )

    i.e. ``-logsigmoid(beta a - beta b - gamma)`` for eps = 0: the implicit rewards are
    ``beta a`` and ``beta b`` and ``gamma`` is the target reward margin, in reward units. This is
    TRL's ``CPOTrainer(loss_type="simpo")`` with ``cpo_alpha=0``: TRL's ``simpo_gamma`` is this
    ``gamma`` (the margin), not the SimPO repository's ``gamma_beta_ratio`` (= gamma / beta).

    Args:
        policy_chosen_logps, policy_rejected_logps: [B] summed log-probs under the policy.
        chosen_lengths, rejected_lengths: [B] completion token counts (> 0).
        beta: > 0 (the paper uses 2-10); gamma: target margin (paper: 0.3-1.6).

    Metrics (detached 0-dim): ``rewards/chosen`` = mean beta a, ``rewards/rejected`` = mean beta b,
    ``rewards/margins``, ``rewards/accuracies``, ``logps/chosen`` = mean a, ``logps/rejected`` =
    mean b (average log-probs, as TRL logs them), ``loss/total``.
    """
    if policy_chosen_logps.dim() != 1:
        raise ValueError(f"policy_chosen_logps has shape {tuple(policy_chosen_logps.shape)}, expected [B]")
    check_shape("policy_rejected_logps", policy_rejected_logps, tuple(policy_chosen_logps.shape))
    if not beta > 0:
        raise ValueError(f"beta={beta!r} is invalid: expected a number > 0")
    if not 0.0 <= label_smoothing <= 0.5:
        raise ValueError(f"label_smoothing={label_smoothing!r} is invalid: expected a number in [0, 0.5]")
    pc, pr = compute_dtype(policy_chosen_logps), compute_dtype(policy_rejected_logps)
    a = pc / _lengths("chosen_lengths", chosen_lengths, pc)
    b = pr / _lengths("rejected_lengths", rejected_lengths, pr)

    z = a - b - gamma / beta
    loss = _smoothed_sigmoid_loss(beta * z, label_smoothing).mean()

    metrics = _preference_metrics(beta * a, beta * b, a, b)
    metrics["loss/total"] = metric(loss)
    return loss, metrics


def _log1mexp(a: torch.Tensor) -> torch.Tensor:
    """``log(1 - exp(a))`` for a < 0, accurate near 0 and for very negative a (Maechler 2012)."""
    near_zero = a > -math.log(2.0)
    # Each branch sees a safe stand-in where it is not selected, so neither produces inf/NaN grads.
    a_near = torch.where(near_zero, a, torch.full_like(a, -1.0))
    a_far = torch.where(near_zero, torch.full_like(a, -1.0), a)
    return torch.where(near_zero, torch.log(-torch.expm1(a_near)), torch.log1p(-torch.exp(a_far)))


def orpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    chosen_lengths: torch.Tensor,
    rejected_lengths: torch.Tensor,
    chosen_nll: torch.Tensor,
    *,
    lam: float,
) -> tuple[torch.Tensor, Metrics]:
    """ORPO (Hong et al. 2024, arXiv:2403.07691, eqs. 4-7): SFT plus an odds-ratio penalty, no reference.

    With ``a = pi_c / |c|``, ``b = pi_r / |r|`` (average log-probs; odds(p) = p / (1 - p))::

        log_odds = log odds(e^a) - log odds(e^b) = (a - b) - (log(1 - e^a) - log(1 - e^b))
        loss = chosen_nll + lam * mean( -logsigmoid(log_odds) )

    As TRL's ``ORPOTrainer`` (whose ``beta`` is this ``lam``): ``loss = nll - mean(lam *
    logsigmoid(log_odds))``, implicit rewards ``lam a`` and ``lam b``. ``log(1 - e^a)`` is computed
    stably (TRL uses ``log1p(-exp(a))``; same values, finite gradients closer to a = 0).

    Args:
        policy_chosen_logps, policy_rejected_logps: [B] summed log-probs under the policy (< 0).
        chosen_lengths, rejected_lengths: [B] completion token counts (> 0).
        chosen_nll: the SFT term on the chosen completions: 0-dim (TRL: the token-mean
            cross-entropy over the chosen completions of the batch, e.g. ``sft_loss``'s loss) or
            [B] (averaged here).
        lam: weight of the odds-ratio term (the paper's lambda; TRL's default 0.1).

    Metrics (detached 0-dim): ``rewards/chosen`` = mean lam a, ``rewards/rejected`` = mean lam b,
    ``rewards/margins``, ``rewards/accuracies``, ``logps/chosen`` = mean a, ``logps/rejected`` = mean b,
    ``orpo/log_odds_ratio`` = mean log_odds (TRL calls this ``log_odds_chosen``; TRL's
    ``log_odds_ratio`` is our ``orpo/log_sigmoid_odds`` = mean logsigmoid(log_odds)),
    ``loss/nll``, ``loss/or`` (= lam * mean(-logsigmoid(log_odds))), ``loss/total``.
    """
    if policy_chosen_logps.dim() != 1:
        raise ValueError(f"policy_chosen_logps has shape {tuple(policy_chosen_logps.shape)}, expected [B]")
    check_shape("policy_rejected_logps", policy_rejected_logps, tuple(policy_chosen_logps.shape))
    if chosen_nll.dim() not in (0, 1) or (chosen_nll.dim() == 1 and chosen_nll.shape != policy_chosen_logps.shape):
        raise ValueError(f"chosen_nll has shape {tuple(chosen_nll.shape)}, expected [] or [B]")
    if lam < 0:
        raise ValueError(f"lam={lam!r} is invalid: expected a number >= 0")
    pc, pr = compute_dtype(policy_chosen_logps), compute_dtype(policy_rejected_logps)
    a = pc / _lengths("chosen_lengths", chosen_lengths, pc)
    b = pr / _lengths("rejected_lengths", rejected_lengths, pr)

    log_odds = (a - b) - (_log1mexp(a) - _log1mexp(b))
    log_sig = F.logsigmoid(log_odds)
    nll = compute_dtype(chosen_nll).mean()
    or_loss = -lam * log_sig.mean()
    loss = nll + or_loss

    metrics = _preference_metrics(lam * a, lam * b, a, b)
    metrics["orpo/log_odds_ratio"] = metric(log_odds.mean())
    metrics["orpo/log_sigmoid_odds"] = metric(log_sig.mean())
    metrics["loss/nll"] = metric(nll)
    metrics["loss/or"] = metric(or_loss)
    metrics["loss/total"] = metric(loss)
    return loss, metrics


def nll_only_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    chosen_nll: torch.Tensor,
) -> tuple[torch.Tensor, Metrics]:
    """The NLL-only baseline (TRL 1.16's ``loss_type="sft"``): continued SFT on the chosen completions, the
    rejected ones unused. It separates what a preference loss adds from what more SFT on the chosen data does.

    Args:
        policy_chosen_logps, policy_rejected_logps: [B] summed log-probs (for the metrics only).
        chosen_nll: the token-mean NLL of the chosen completions (``sft_loss``), the loss itself: 0-dim, or
            [B] per-pair parts whose mean is it (a micro-batch of the step, as ``orpo_loss`` takes it).

    Metrics: ``loss/nll``, ``loss/total``; ``rewards/*`` are the policy's own summed log-probs (a
    reference-free implicit reward at beta 1), so ``rewards/accuracies`` is the share of pairs whose chosen
    completion the policy finds more likely; ``logps/*``.
    """
    check_shape("policy_rejected_logps", policy_rejected_logps, tuple(policy_chosen_logps.shape))
    loss = compute_dtype(chosen_nll).mean()
    pc, pr = compute_dtype(policy_chosen_logps).detach(), compute_dtype(policy_rejected_logps).detach()
    m = _preference_metrics(pc, pr, pc, pr)
    m["loss/nll"] = metric(loss)
    m["loss/total"] = metric(loss)
    return loss, m


def add_nll_term(loss: torch.Tensor, metrics: Metrics, chosen_nll: torch.Tensor, weight: float
                 ) -> tuple[torch.Tensor, Metrics]:
    """RPO (Pang et al. 2024, "Iterative Reasoning Preference Optimization", eq. 2): a preference loss plus
    ``weight`` times the token-mean NLL of the chosen completions; TRL 1.16 writes it
    ``loss_type=["sigmoid", "sft"], loss_weights=[1, weight]``. Metrics gain ``loss/nll``; ``loss/total``
    becomes the sum. ``chosen_nll``: 0-dim, or [B] per-pair parts whose mean is the token-mean NLL."""
    nll = compute_dtype(chosen_nll).mean()
    total = loss + weight * nll
    return total, {**metrics, "loss/nll": metric(nll), "loss/total": metric(total)}
