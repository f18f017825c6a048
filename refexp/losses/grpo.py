"""GRPO: group-relative advantages and the clipped-surrogate loss with a KL penalty.

Shapes and conventions: refexp/losses/__init__.py.
"""

from __future__ import annotations

from typing import Callable

import torch

from refexp.choices import ADVANTAGE_SCALES, GRPO_LOSS_AGGS
from refexp.losses.common import Metrics, check_shape, metric
from refexp.losses.kl import compute_dtype, kl_estimate, masked_mean, masked_sum, where_mask


def group_advantages(
    rewards_N: torch.Tensor,
    group_size: int,
    scale: str = "group",
    eps: float = 1e-4,
    *,
    batch_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Group-relative advantages (Shao et al. 2024, DeepSeekMath sec. 4.1.2; TRL's ``scale_rewards``).

    Rows are grouped prompt-major: ``[p0g0, ..., p0g(G-1), p1g0, ...]`` with ``G = group_size``.
    ``adv = (r - mean of r's group) / (s + eps)`` with ``s`` =

    * ``"group"``: the std of r's group,
    * ``"batch"``: the std of all rewards of the batch (Liu et al. 2025's "batch" scaling; the mean is
      still the group's). When the batch is spread over data-parallel ranks, ``batch_sum`` sums a
      tensor over them (``refexp.runtime.distributed.dp_sum``), so the std is the global batch's; groups
      never cross ranks, so the means stay local,
    * ``"none"``: no division at all (Dr. GRPO, Liu et al. 2025, arXiv:2503.20783).

    As in TRL: the std is the unbiased one (``torch.std``, Bessel's correction, N-1), taken as 0
    for a single element; ``eps`` is added to the std, not under a square root; with ``"none"``,
    eps is not used either (TRL does not divide). A group whose rewards are all equal gets
    advantage exactly 0.

    Args:
        rewards_N: [N] rewards, N a multiple of ``group_size``.
        batch_sum: ``"batch"`` only: sums a tensor over the ranks holding the rest of the batch
            (None: this call holds the whole batch).

    Returns:
        adv_N: [N], detached (advantages are constants of the policy-gradient loss), float32 or wider.
    """
    if rewards_N.dim() != 1:
        raise ValueError(f"rewards_N has shape {tuple(rewards_N.shape)}, expected one dimension [N]")
    if group_size < 1 or rewards_N.numel() % group_size != 0:
        raise ValueError(f"group_size={group_size!r} is invalid: expected a positive divisor of N={rewards_N.numel()}")
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"scale={scale!r} is invalid: expected one of {', '.join(ADVANTAGE_SCALES)}")
    r = compute_dtype(rewards_N.detach())
    grouped = r.reshape(-1, group_size)
    adv = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)
    if scale == "none":
        return adv
    if scale == "group":
        std = grouped.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(grouped)
        std = std.expand_as(grouped).reshape(-1)
    else:
        std = _batch_std(r, batch_sum or (lambda t: t))
    return adv / (std + eps)


def _batch_std(r_N: torch.Tensor, batch_sum: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The unbiased std of the rewards of every rank from three sums (count, sum, sum of squares), so
    one all-reduce of each gives the global value; 0 for a single reward."""
    n = batch_sum(torch.tensor(float(r_N.numel()), dtype=r_N.dtype, device=r_N.device))
    s1 = batch_sum(r_N.sum())
    s2 = batch_sum((r_N * r_N).sum())
    var = (s2 - s1 * s1 / n) / (n - 1).clamp(min=1)
    return var.clamp(min=0).sqrt()


def _aggregate(
    x_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    loss_agg: str,
    max_completion_length: int | None,
    num_active_tokens: float | torch.Tensor | None,
) -> torch.Tensor:
    if loss_agg == "grpo":
        return masked_mean(x_BT, mask_BT, dim=-1).mean()
    if loss_agg == "dr_grpo":
        return masked_sum(x_BT, mask_BT) / (x_BT.shape[0] * max_completion_length)
    # dapo
    n = mask_BT.ne(0).sum() if num_active_tokens is None else num_active_tokens
    n = torch.as_tensor(n, dtype=x_BT.dtype, device=x_BT.device)
    return masked_sum(x_BT, mask_BT) / n.clamp(min=1)


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor | None,
    ref_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    beta: float,
    eps_low: float,
    eps_high: float,
    kl_estimator: str = "k3",
    loss_agg: str = "grpo",
    max_completion_length: int | None = None,
    num_active_tokens: float | torch.Tensor | None = None,
    token_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """Clipped-surrogate GRPO loss with a KL penalty towards the reference (Shao et al. 2024, eq. 3).

    Per completion token (b, t), with ``r = exp(logp - old_logp)`` and ``A = advantages[b]``::

        l[b, t] = -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A) + beta * kl[b, t]

    ``kl`` is ``kl_estimate(logp, ref_logp, kl_estimator)`` (k3 by default, as GRPO/TRL); there is
    no KL term when ``ref_logp`` is None or ``beta == 0``. Its expected gradient is that of
    KL(ref || policy) for k3, KL(policy || ref) for k2 and zero for k1 (refexp/losses/kl.py). ``eps_high > eps_low``
    is DAPO's clip-higher (Yu et al. 2025, arXiv:2503.14476). The scalar loss aggregates ``l`` over the mask:

    * ``"grpo"``: mean over sequences of each sequence's token mean (the paper's 1/G sum 1/|o_i|),
    * ``"dr_grpo"``: ``sum / (B * max_completion_length)`` (Liu et al. 2025, arXiv:2503.20783; a
      constant normaliser, so no length bias); ``max_completion_length`` is then required,
    * ``"dapo"``: ``sum / number of active tokens`` (DAPO's token-level policy-gradient loss).

    Args:
        logp: [B, T] policy log-probs of the sampled completion tokens (carries the graph).
        old_logp: [B, T] behaviour-policy log-probs (detached here); None means on-policy, i.e.
            ``logp.detach()`` (r = 1, TRL's ``num_iterations == 1`` shortcut).
        ref_logp: [B, T] reference log-probs (detached here), or None (reference-free).
        advantages: [B] one advantage per completion (``group_advantages``), detached here.
        mask: [B, T] completion tokens.
        beta: KL coefficient (>= 0).
        eps_low, eps_high: clip range of the ratio.
        kl_estimator: ``"k1" | "k2" | "k3"`` for the loss term.
        loss_agg: ``"grpo" | "dr_grpo" | "dapo"``.
        max_completion_length: the generation budget L, required by ``"dr_grpo"``.
        num_active_tokens: for ``"dapo"`` only: the denominator to use instead of this call's
            active-token count, e.g. the token count of the whole batch across gradient-
            accumulation micro-batches and data-parallel ranks (TRL's ``num_items_in_batch``), so
            that accumulated gradients equal one big batch's.
        token_weight: [B, T] per-token weights (detached here) of the policy term ``-min(...)``, not of the KL
            term: truncated importance sampling's ``min(pi_trainer / pi_rollout, cap)`` (Yao et al. 2025;
            verl multiplies its ``pg_losses`` the same way). None = 1.

    Metrics (detached 0-dim):
        ``loss/policy`` and ``loss/kl`` (the beta * kl part; 0 without a KL term), aggregated the
        same way as the loss, so ``loss/policy + loss/kl == loss/total``;
        ``kl/ref``: the logged KL, ``mean_token_kl`` with k3 whatever ``kl_estimator`` is (only
        when ``ref_logp`` is given, also when beta == 0);
        ``clip/low``: fraction of tokens with ``r < 1 - eps_low`` and ``A < 0``, ``clip/high``:
        ``r > 1 + eps_high`` and ``A > 0``, ``clip/ratio``: either (the tokens whose gradient the
        clip removes; TRL's ``clip_ratio/*``), all token-weighted over the mask.

    Departures from TRL: ``bnpo`` is not offered (it is ``dapo`` without ``num_active_tokens``);
    TRL's division by gradient-accumulation steps is left to the caller; the log-ratio is not
    clamped (as TRL; torchtitan clamps it to +-10).
    """
    _check_grpo_inputs(logp, old_logp, ref_logp, advantages, mask, beta=beta, kl_estimator=kl_estimator,
                       loss_agg=loss_agg, max_completion_length=max_completion_length,
                       num_active_tokens=num_active_tokens, token_weight=token_weight)
    m = mask.ne(0)
    logp = where_mask(compute_dtype(logp), m)
    old = logp.detach() if old_logp is None else where_mask(compute_dtype(old_logp.detach()), m)
    adv = compute_dtype(advantages.detach()).unsqueeze(1)

    ratio = torch.exp(logp - old)
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    policy_BT = -torch.min(ratio * adv, clipped * adv)
    if token_weight is not None:
        policy_BT = policy_BT * compute_dtype(token_weight.detach())
    policy = _aggregate(policy_BT, m, loss_agg, max_completion_length, num_active_tokens)

    metrics: Metrics = {}
    kl_part = torch.zeros((), dtype=policy.dtype, device=policy.device)
    if ref_logp is not None:
        ref = where_mask(compute_dtype(ref_logp.detach()), m)
        if beta != 0.0:
            kl_BT = kl_estimate(logp, ref, kl_estimator)
            kl_part = _aggregate(beta * kl_BT, m, loss_agg, max_completion_length, num_active_tokens)
        with torch.no_grad():
            metrics["kl/ref"] = metric(masked_mean(kl_estimate(logp, ref, "k3"), m))
    loss = policy + kl_part

    with torch.no_grad():
        low = (ratio < 1.0 - eps_low) & (adv < 0)
        high = (ratio > 1.0 + eps_high) & (adv > 0)
        metrics["clip/low"] = metric(masked_mean(low.to(policy.dtype), m))
        metrics["clip/high"] = metric(masked_mean(high.to(policy.dtype), m))
        metrics["clip/ratio"] = metric(masked_mean((low | high).to(policy.dtype), m))
    metrics["loss/policy"] = metric(policy)
    metrics["loss/kl"] = metric(kl_part)
    metrics["loss/total"] = metric(loss)
    return loss, metrics


def _check_grpo_inputs(logp, old_logp, ref_logp, advantages, mask, *, beta, kl_estimator, loss_agg,
                       max_completion_length, num_active_tokens, token_weight) -> None:
    """``grpo_loss``'s shape and option checks (ValueError naming the argument)."""
    if logp.dim() != 2:
        raise ValueError(f"logp has shape {tuple(logp.shape)}, expected [B, T]")
    B, T = logp.shape
    check_shape("mask", mask, (B, T))
    check_shape("advantages", advantages, (B,))
    if old_logp is not None:
        check_shape("old_logp", old_logp, (B, T))
    if ref_logp is not None:
        check_shape("ref_logp", ref_logp, (B, T))
    if token_weight is not None:
        check_shape("token_weight", token_weight, (B, T))
    if loss_agg not in GRPO_LOSS_AGGS:
        raise ValueError(f"loss_agg={loss_agg!r} is invalid: expected one of {', '.join(GRPO_LOSS_AGGS)}")
    if loss_agg == "dr_grpo" and (max_completion_length is None or max_completion_length < 1):
        raise ValueError(
            f"max_completion_length={max_completion_length!r} is invalid: loss_agg='dr_grpo' needs the "
            "generation budget (a positive integer)"
        )
    if num_active_tokens is not None and loss_agg != "dapo":
        raise ValueError(f"num_active_tokens is only used by loss_agg='dapo', not {loss_agg!r}")
    if beta < 0:
        raise ValueError(f"beta={beta!r} is invalid: expected a number >= 0")
    if kl_estimator not in ("k1", "k2", "k3"):
        raise ValueError(f"kl_estimator={kl_estimator!r} is invalid: expected one of k1, k2, k3")
