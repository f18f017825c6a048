"""KL estimators, and the masked tensor helpers they and the losses share.

Every KL in refexp is ``KL(policy || other)`` estimated from tokens *sampled from the policy*
(completions in GRPO), with the per-token estimators of Schulman, "Approximating KL Divergence"
(2020, http://joschu.net/blog/kl-approx.html). Writing ``delta = other_logp - logp``
(the log of the ratio other/policy at a sampled token):

    k1 = -delta                      = logp - other_logp     unbiased, high variance, can be < 0
    k2 = 1/2 * delta**2                                      biased, low variance, >= 0
    k3 = exp(delta) - delta - 1                              unbiased, low variance, >= 0

k3 is what TRL's GRPOTrainer puts in its loss and logs as ``kl``.

**Which divergence a loss term's gradient follows.** As a *value*, each estimator's mean over
samples of the policy estimates KL(policy || other). As a *loss term* ``E_{x~pi}[k(x)]`` whose samples
are not differentiated (the way GRPO uses it), the expected gradient is ``E_pi[grad k]``, and that is
a different quantity for each (Tang & Munos 2025, "On a few pitfalls in KL divergence gradient
estimation for RL", arXiv:2506.09477; ``tests/test_kl.py`` checks each on a small categorical, exactly):

    k1:  E_pi[grad log pi]                    = 0                       no regularisation at all
    k2:  E_pi[log(pi/other) grad log pi]      = grad KL(policy || other)
    k3:  E_pi[(1 - other/pi) grad log pi]     = grad KL(other || policy)

So GRPO's k3 penalty (DeepSeekMath eq. 4) regularises towards the reference through the *forward*
KL(ref || policy). refexp's config refuses k1 in the loss. As a *reward* penalty (detached, through
the policy gradient) k1 is the right one: ``E_pi[k1 * grad log pi]`` is the score-function form of
grad KL(policy || other), which is why ``algo.kl_in_reward`` uses k1 whatever ``kl_estimator`` says.

**The logged KL.** ``kl/ref`` (against the current reference) and ``kl/init`` (against the frozen
initial model) are both ``mean_token_kl(..., estimator="k3")``: the k3 estimate averaged over all
completion tokens of the batch, each token weighted equally (TRL's ``kl`` metric). It does not
depend on the estimator a run puts in its loss, so runs that differ in ``kl_estimator`` still log
comparable numbers. ``sequence_kl`` (sum over a sequence's tokens) is the per-sequence KL used to
penalise rewards (``kl_in_reward``).

The KL-coefficient controllers (a fixed or adaptive beta) are in ``refexp/reference/kl_control.py``.

Shapes: ``_BT`` is [batch, completion tokens], ``_B`` is [batch]. Masks are bool or {0, 1}; masked
positions may hold any finite value (they are replaced by 0 before any arithmetic, so neither their
value nor their gradient reaches the result).
"""

from __future__ import annotations

import torch

KL_ESTIMATORS = ("k1", "k2", "k3")


def compute_dtype(x: torch.Tensor) -> torch.Tensor:
    """Promote half precision to float32 (exp of log-ratios in bf16 loses the small differences we measure)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || ref) at tokens sampled from the policy (Schulman 2020).

    Args:
        logp: log-probs of the sampled tokens under the policy, any shape (usually [B, T]).
        ref_logp: log-probs of the same tokens under the reference, same shape.
        estimator: ``"k1"`` (logp - ref), ``"k2"`` (1/2 (logp - ref)^2) or ``"k3"``
            (exp(ref - logp) - (ref - logp) - 1).

    Returns:
        Tensor of the same shape (float32 or wider), differentiable in both arguments; no masking,
        no reduction. Callers that treat the reference as a constant detach ``ref_logp``.
    """
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp {tuple(logp.shape)} and ref_logp {tuple(ref_logp.shape)} must have the same shape")
    delta = compute_dtype(ref_logp) - compute_dtype(logp)
    if estimator == "k1":
        return -delta
    if estimator == "k2":
        return 0.5 * delta.square()
    if estimator == "k3":
        return torch.exp(delta) - delta - 1.0
    raise ValueError(f"estimator={estimator!r} is invalid: expected one of {', '.join(KL_ESTIMATORS)}")


def bool_mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if mask.shape != like.shape:
        raise ValueError(f"mask {tuple(mask.shape)} must have the shape of its values {tuple(like.shape)}")
    return mask if mask.dtype == torch.bool else mask != 0


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x`` where ``mask`` is set (over ``dim``, or everything when ``dim`` is None).

    Masked positions are replaced by 0 with ``torch.where`` (not multiplied by 0), so an inf/NaN
    there cannot turn the sum into NaN.
    """
    m = bool_mask(mask, x)
    kept = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over the positions where ``mask`` is set.

    Args:
        x: values, e.g. [B, T].
        mask: same shape, bool or {0, 1}.
        dim: reduce over this dimension (e.g. ``dim=-1`` gives a per-sequence mean [B]); None
            reduces over everything (a token-weighted mean: long sequences weigh more).

    Returns:
        The mean; 0 where nothing is masked in (the count is clamped to >= 1, as TRL does).
    """
    m = bool_mask(mask, x)
    count = m.sum() if dim is None else m.sum(dim)
    return masked_sum(x, m, dim) / count.clamp(min=1).to(x.dtype)


def where_mask(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Zero the masked-out inputs *before* arithmetic, so their gradient is exactly 0, never NaN."""
    m = bool_mask(mask, x)
    return torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))


def sequence_kl(
    logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor, mask_BT: torch.Tensor, estimator: str = "k3"
) -> torch.Tensor:
    """Per-sequence KL(policy || ref): the sum over a sequence's completion tokens of ``kl_estimate``.

    The sum over tokens of a per-token estimator estimates the KL between the sequence
    distributions (the chain rule of KL), which is the penalty Ziegler et al. (2019) subtract from
    the reward.

    Returns:
        kl_B: [B].
    """
    kl_BT = kl_estimate(where_mask(logp_BT, mask_BT), where_mask(ref_logp_BT, mask_BT), estimator)
    return masked_sum(kl_BT, mask_BT, dim=-1)


def mean_token_kl(
    logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor, mask_BT: torch.Tensor, estimator: str = "k3"
) -> torch.Tensor:
    """Token-weighted mean over all completion tokens of ``kl_estimate``: the logged ``kl/*`` value.

    ``sum over (b, t) in mask of kl[b, t] / number of masked tokens`` (0 when the mask is empty).
    Across data-parallel ranks the exact global value is the all-reduced masked sum divided by the
    all-reduced token count (``masked_sum`` and ``mask.sum()``); the mean of per-rank means is
    close but weighs ranks equally.

    Returns:
        0-dim tensor (differentiable; detach it for logging).
    """
    kl_BT = kl_estimate(where_mask(logp_BT, mask_BT), where_mask(ref_logp_BT, mask_BT), estimator)
    return masked_mean(kl_BT, mask_BT)
