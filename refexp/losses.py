"""Pure loss functions: tensors in, ``(loss, metrics)`` out.

Nothing here knows about models, optimizers or distributed state. Shapes are in the names
(``_BT`` = [batch, completion tokens], ``_B`` / ``_N`` = one value per sequence). Masks are bool or
{0, 1}; values at masked positions are zeroed with ``torch.where`` before any arithmetic, so they
reach neither the loss nor the gradient.

Conventions shared by every function:

* ``loss`` is a 0-dim tensor carrying the graph. Half-precision inputs are promoted to float32
  first, so the loss is float32 (or float64 for float64 inputs).
* ``metrics`` maps ``/``-namespaced names to **detached 0-dim tensors** (on the inputs' device), so
  a caller can all-reduce them before calling ``.item()``. ``loss/total`` is always present and
  equals ``loss``.
* Reference log-probs (``ref_*``) and behaviour log-probs (``old_logp``) are constants: they are
  detached here, so no gradient reaches them even if a caller forgot ``no_grad``.

The definitions follow TRL 1.16 (``GRPOTrainer._compute_loss``, ``DPOTrainer`` loss types,
``CPOTrainer`` ``loss_type="simpo"``, ``ORPOTrainer.odds_ratio_loss``); each docstring lists where
it departs from TRL.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from refexp.kl import _compute_dtype, _where_mask, kl_estimate, masked_mean, masked_sum

ADVANTAGE_SCALES = ("group", "batch", "none")
GRPO_LOSS_AGGS = ("grpo", "dr_grpo", "dapo")
DPO_LOSS_TYPES = ("sigmoid", "ipo", "robust", "hinge")

Metrics = dict[str, torch.Tensor]


def _metric(x: torch.Tensor) -> torch.Tensor:
    return x.detach().reshape(())


def _check_shape(name: str, x: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {tuple(shape)}")


# ---------------------------------------------------------------- SFT


def sft_loss(logp_BT: torch.Tensor, mask_BT: torch.Tensor) -> tuple[torch.Tensor, Metrics]:
    """Next-token negative log-likelihood, averaged over all target tokens of the batch.

    ``loss = -sum_{(b,t) in mask} logp[b, t] / |mask|`` (token-weighted, like
    ``F.cross_entropy(..., ignore_index=-100)`` over the flattened batch; 0 for an empty mask).

    Args:
        logp_BT: [B, T] log-probs of the target tokens under the model.
        mask_BT: [B, T] target tokens (completion, not prompt or padding).

    Metrics: ``loss/sft``, ``loss/total`` (the same value).
    """
    loss = -masked_mean(_compute_dtype(logp_BT), mask_BT)
    return loss, {"loss/sft": _metric(loss), "loss/total": _metric(loss)}


# ---------------------------------------------------------------- GRPO


def group_advantages(
    rewards_N: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-4
) -> torch.Tensor:
    """Group-relative advantages (Shao et al. 2024, DeepSeekMath sec. 4.1.2; TRL's ``scale_rewards``).

    Rows are grouped prompt-major: ``[p0g0, ..., p0g(G-1), p1g0, ...]`` with ``G = group_size``.
    ``adv = (r - mean of r's group) / (s + eps)`` with ``s`` =

    * ``"group"``: the std of r's group,
    * ``"batch"``: the std of all N rewards (Liu et al. 2025's "batch" scaling; the mean is still the
      group's),
    * ``"none"``: no division at all (Dr. GRPO, Liu et al. 2025, arXiv:2503.20783).

    As in TRL: the std is the unbiased one (``torch.std``, Bessel's correction, N-1), taken as 0
    for a single element; ``eps`` is added to the std, not under a square root; with ``"none"``,
    eps is not used either (TRL does not divide). A group whose rewards are all equal gets
    advantage exactly 0.

    Args:
        rewards_N: [N] rewards, N a multiple of ``group_size``.

    Returns:
        adv_N: [N], detached (advantages are constants of the policy-gradient loss), float32 or wider.
    """
    if rewards_N.dim() != 1:
        raise ValueError(f"rewards_N has shape {tuple(rewards_N.shape)}, expected one dimension [N]")
    if group_size < 1 or rewards_N.numel() % group_size != 0:
        raise ValueError(f"group_size={group_size!r} is invalid: expected a positive divisor of N={rewards_N.numel()}")
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"scale={scale!r} is invalid: expected one of {', '.join(ADVANTAGE_SCALES)}")
    r = _compute_dtype(rewards_N.detach())
    grouped = r.reshape(-1, group_size)
    adv = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)
    if scale == "none":
        return adv
    if scale == "group":
        std = grouped.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(grouped)
        std = std.expand_as(grouped).reshape(-1)
    else:
        std = r.std() if r.numel() > 1 else torch.zeros((), dtype=r.dtype, device=r.device)
    return adv / (std + eps)


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
) -> tuple[torch.Tensor, Metrics]:
    """Clipped-surrogate GRPO loss with a KL(policy || ref) penalty (Shao et al. 2024, eq. 3).

    Per completion token (b, t), with ``r = exp(logp - old_logp)`` and ``A = advantages[b]``::

        l[b, t] = -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A) + beta * kl[b, t]

    ``kl`` is ``kl_estimate(logp, ref_logp, kl_estimator)`` (k3 by default, as GRPO/TRL); there is
    no KL term when ``ref_logp`` is None or ``beta == 0``. ``eps_high > eps_low`` is DAPO's
    clip-higher (Yu et al. 2025, arXiv:2503.14476). The scalar loss aggregates ``l`` over the mask:

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
    if logp.dim() != 2:
        raise ValueError(f"logp has shape {tuple(logp.shape)}, expected [B, T]")
    B, T = logp.shape
    _check_shape("mask", mask, (B, T))
    _check_shape("advantages", advantages, (B,))
    if old_logp is not None:
        _check_shape("old_logp", old_logp, (B, T))
    if ref_logp is not None:
        _check_shape("ref_logp", ref_logp, (B, T))
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

    m = mask.ne(0)
    logp = _where_mask(_compute_dtype(logp), m)
    old = logp.detach() if old_logp is None else _where_mask(_compute_dtype(old_logp.detach()), m)
    adv = _compute_dtype(advantages.detach()).unsqueeze(1)

    ratio = torch.exp(logp - old)
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    policy_BT = -torch.min(ratio * adv, clipped * adv)
    policy = _aggregate(policy_BT, m, loss_agg, max_completion_length, num_active_tokens)

    metrics: Metrics = {}
    kl_part = torch.zeros((), dtype=policy.dtype, device=policy.device)
    if ref_logp is not None:
        ref = _where_mask(_compute_dtype(ref_logp.detach()), m)
        if beta != 0.0:
            kl_BT = kl_estimate(logp, ref, kl_estimator)
            kl_part = _aggregate(beta * kl_BT, m, loss_agg, max_completion_length, num_active_tokens)
        with torch.no_grad():
            metrics["kl/ref"] = _metric(masked_mean(kl_estimate(logp, ref, "k3"), m))
    loss = policy + kl_part

    with torch.no_grad():
        low = (ratio < 1.0 - eps_low) & (adv < 0)
        high = (ratio > 1.0 + eps_high) & (adv > 0)
        metrics["clip/low"] = _metric(masked_mean(low.to(policy.dtype), m))
        metrics["clip/high"] = _metric(masked_mean(high.to(policy.dtype), m))
        metrics["clip/ratio"] = _metric(masked_mean((low | high).to(policy.dtype), m))
    metrics["loss/policy"] = _metric(policy)
    metrics["loss/kl"] = _metric(kl_part)
    metrics["loss/total"] = _metric(loss)
    return loss, metrics


# ---------------------------------------------------------------- DPO family


def _preference_metrics(
    chosen_rewards: torch.Tensor,
    rejected_rewards: torch.Tensor,
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
) -> Metrics:
    """TRL's ``rewards/*`` and ``logps/*`` (with ``margin``/``accuracy`` in the singular)."""
    return {
        "rewards/chosen": _metric(chosen_rewards.mean()),
        "rewards/rejected": _metric(rejected_rewards.mean()),
        "rewards/margin": _metric((chosen_rewards - rejected_rewards).mean()),
        "rewards/accuracy": _metric((chosen_rewards > rejected_rewards).to(chosen_rewards.dtype).mean()),
        "logps/chosen": _metric(chosen_logps.mean()),
        "logps/rejected": _metric(rejected_logps.mean()),
    }


def _lengths(name: str, lengths: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    if lengths is None:
        raise ValueError(f"{name} is required")
    n = torch.as_tensor(lengths, device=like.device).to(like.dtype)
    _check_shape(name, n, tuple(like.shape))
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
    ``rewards/rejected``, ``rewards/margin`` (mean chosen - rejected reward), ``rewards/accuracy``
    (fraction of pairs with chosen reward strictly greater), ``logps/chosen``, ``logps/rejected``
    (policy, as used in the loss, i.e. averaged for IPO with lengths), ``loss/total``.

    Departures from TRL: ``label_smoothing != 0`` with ``ipo``/``hinge`` raises (TRL ignores it);
    ``robust`` requires ``0 <= label_smoothing < 1/2`` (TRL's newest versions check the same).
    """
    shape_B = tuple(policy_chosen_logps.shape)
    if len(shape_B) != 1:
        raise ValueError(f"policy_chosen_logps has shape {shape_B}, expected [B]")
    for name, t in (
        ("policy_rejected_logps", policy_rejected_logps),
        ("ref_chosen_logps", ref_chosen_logps),
        ("ref_rejected_logps", ref_rejected_logps),
    ):
        _check_shape(name, t, shape_B)
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

    pc, pr = _compute_dtype(policy_chosen_logps), _compute_dtype(policy_rejected_logps)
    rc, rr = _compute_dtype(ref_chosen_logps.detach()), _compute_dtype(ref_rejected_logps.detach())
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
    metrics["loss/total"] = _metric(loss)
    return loss, metrics


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
    ``rewards/margin``, ``rewards/accuracy``, ``logps/chosen`` = mean a, ``logps/rejected`` =
    mean b (average log-probs, as TRL logs them), ``loss/total``.
    """
    if policy_chosen_logps.dim() != 1:
        raise ValueError(f"policy_chosen_logps has shape {tuple(policy_chosen_logps.shape)}, expected [B]")
    _check_shape("policy_rejected_logps", policy_rejected_logps, tuple(policy_chosen_logps.shape))
    if not beta > 0:
        raise ValueError(f"beta={beta!r} is invalid: expected a number > 0")
    if not 0.0 <= label_smoothing <= 0.5:
        raise ValueError(f"label_smoothing={label_smoothing!r} is invalid: expected a number in [0, 0.5]")
    pc, pr = _compute_dtype(policy_chosen_logps), _compute_dtype(policy_rejected_logps)
    a = pc / _lengths("chosen_lengths", chosen_lengths, pc)
    b = pr / _lengths("rejected_lengths", rejected_lengths, pr)

    z = a - b - gamma / beta
    loss = _smoothed_sigmoid_loss(beta * z, label_smoothing).mean()

    metrics = _preference_metrics(beta * a, beta * b, a, b)
    metrics["loss/total"] = _metric(loss)
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
    ``rewards/margin``, ``rewards/accuracy``, ``logps/chosen`` = mean a, ``logps/rejected`` = mean b,
    ``orpo/log_odds_ratio`` = mean log_odds (TRL calls this ``log_odds_chosen``; TRL's
    ``log_odds_ratio`` is our ``orpo/log_sigmoid_odds`` = mean logsigmoid(log_odds)),
    ``loss/nll``, ``loss/or`` (= lam * mean(-logsigmoid(log_odds))), ``loss/total``.
    """
    if policy_chosen_logps.dim() != 1:
        raise ValueError(f"policy_chosen_logps has shape {tuple(policy_chosen_logps.shape)}, expected [B]")
    _check_shape("policy_rejected_logps", policy_rejected_logps, tuple(policy_chosen_logps.shape))
    if chosen_nll.dim() not in (0, 1) or (chosen_nll.dim() == 1 and chosen_nll.shape != policy_chosen_logps.shape):
        raise ValueError(f"chosen_nll has shape {tuple(chosen_nll.shape)}, expected [] or [B]")
    if lam < 0:
        raise ValueError(f"lam={lam!r} is invalid: expected a number >= 0")
    pc, pr = _compute_dtype(policy_chosen_logps), _compute_dtype(policy_rejected_logps)
    a = pc / _lengths("chosen_lengths", chosen_lengths, pc)
    b = pr / _lengths("rejected_lengths", rejected_lengths, pr)

    log_odds = (a - b) - (_log1mexp(a) - _log1mexp(b))
    log_sig = F.logsigmoid(log_odds)
    nll = _compute_dtype(chosen_nll).mean()
    or_loss = -lam * log_sig.mean()
    loss = nll + or_loss

    metrics = _preference_metrics(lam * a, lam * b, a, b)
    metrics["orpo/log_odds_ratio"] = _metric(log_odds.mean())
    metrics["orpo/log_sigmoid_odds"] = _metric(log_sig.mean())
    metrics["loss/nll"] = _metric(nll)
    metrics["loss/or"] = _metric(or_loss)
    metrics["loss/total"] = _metric(loss)
    return loss, metrics
