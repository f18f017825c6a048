"""Losses against values worked out by hand with `math` (never the same formula through torch)."""

import math
import statistics

import pytest
import torch

from refexp.choices import PREFERENCE_LOSSES
from refexp.losses import dpo_loss, group_advantages, grpo_loss, orpo_loss, sft_loss, simpo_loss

pytestmark = pytest.mark.numerics  # tests/README.md: run under other CPU kernels too


def t(x, grad=False):
    return torch.tensor(x, dtype=torch.float64, requires_grad=grad)


def softplus(z):
    """-log sigmoid(-z) = log(1 + e^z)."""
    return math.log1p(math.exp(z))


def assert_close(x: torch.Tensor, expected, **kw):
    """Compare a (possibly 2-D) tensor with nested lists of hand-computed numbers."""
    flat = [v for row in expected for v in row] if isinstance(expected[0], list) else expected
    assert x.flatten().tolist() == pytest.approx(flat, **kw)


def assert_metrics_detached_scalars(metrics):
    for name, v in metrics.items():
        assert "/" in name
        assert isinstance(v, torch.Tensor) and v.dim() == 0 and not v.requires_grad, name


# ---------------------------------------------------------------- SFT


def test_sft_loss_is_token_mean_nll():
    logp = t([[-1.0, -2.0, -3.0], [-0.5, 9.0, 9.0]], grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    loss, m = sft_loss(logp, mask)
    assert loss.item() == pytest.approx((1 + 2 + 3 + 0.5) / 4)
    assert m["loss/sft"].item() == pytest.approx(1.625) and m["loss/total"].item() == pytest.approx(1.625)
    assert_metrics_detached_scalars(m)
    loss.backward()
    assert_close(logp.grad, [[-0.25, -0.25, -0.25], [-0.25, 0.0, 0.0]])


# ---------------------------------------------------------------- advantages


REWARDS = [1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0]  # two prompts, G = 4; the second group is all-equal


def test_group_advantages_group_scale():
    adv = group_advantages(t(REWARDS), group_size=4, scale="group", eps=1e-4)
    std0 = statistics.stdev(REWARDS[:4])  # unbiased (N - 1), as TRL's torch.std
    assert std0 == pytest.approx(math.sqrt(1 / 3))
    expected = [(r - 0.5) / (std0 + 1e-4) for r in REWARDS[:4]] + [0.0] * 4
    assert adv.tolist() == pytest.approx(expected)
    assert adv[4:].tolist() == [0.0, 0.0, 0.0, 0.0]  # equal rewards: exactly zero


def test_group_advantages_batch_and_none_scale():
    std_all = statistics.stdev(REWARDS)
    means = [0.5] * 4 + [2.0] * 4  # the mean is still the group's
    batch = group_advantages(t(REWARDS), 4, scale="batch")
    assert batch.tolist() == pytest.approx([(r - mu) / (std_all + 1e-4) for r, mu in zip(REWARDS, means)])
    none = group_advantages(t(REWARDS), 4, scale="none")
    assert none.tolist() == pytest.approx([r - mu for r, mu in zip(REWARDS, means)])


def test_group_advantages_edges():
    assert group_advantages(t([3.0, 5.0]), 1).tolist() == [0.0, 0.0]  # G = 1: nothing to compare with
    r = t([1.0, 2.0], grad=True)
    assert not group_advantages(r, 2).requires_grad
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(t(REWARDS), 3)
    with pytest.raises(ValueError, match="scale"):
        group_advantages(t(REWARDS), 4, scale="std")


# ---------------------------------------------------------------- GRPO

# Two completions of different lengths: 3 and 1 tokens.
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])
ADV = [1.0, -2.0]


def _onpolicy(loss_agg, **kw):
    logp = t([[-1.0, -0.3, -2.0], [-0.7, -5.0, -5.0]], grad=True)
    loss, m = grpo_loss(
        logp, logp.detach().clone(), None, t(ADV), MASK, beta=0.0, eps_low=0.2, eps_high=0.2, loss_agg=loss_agg, **kw
    )
    return logp, loss, m


def test_grpo_ratio_one_no_kl_is_minus_mean_advantage_per_aggregation():
    # r = 1 everywhere: each token's loss is -A of its sequence.
    _, grpo, _ = _onpolicy("grpo")
    _, dapo, _ = _onpolicy("dapo")
    _, dr, m = _onpolicy("dr_grpo", max_completion_length=4)
    assert grpo.item() == pytest.approx(-(1.0 + -2.0) / 2)  # mean over sequences of the token mean
    assert dapo.item() == pytest.approx(-(3 * 1.0 + 1 * -2.0) / 4)  # sum / active tokens
    assert dr.item() == pytest.approx(-(3 * 1.0 + 1 * -2.0) / (2 * 4))  # sum / (B * L)
    assert len({round(grpo.item(), 9), round(dapo.item(), 9), round(dr.item(), 9)}) == 3
    assert m["loss/policy"].item() == pytest.approx(dr.item())
    assert m["loss/kl"].item() == 0.0 and "kl/ref" not in m
    assert m["clip/ratio"].item() == 0.0
    assert_metrics_detached_scalars(m)


def test_grpo_gradient_at_ratio_one_follows_aggregation():
    # d(-r A)/dlogp = -A at r = 1, then scaled by the aggregation's weight per token.
    logp, loss, _ = _onpolicy("grpo")
    loss.backward()
    assert_close(logp.grad, [[-1 / 3 / 2] * 3, [2.0 / 2, 0.0, 0.0]])
    logp, loss, _ = _onpolicy("dapo")
    loss.backward()
    assert_close(logp.grad, [[-1 / 4] * 3, [2 / 4, 0.0, 0.0]])


def test_grpo_old_logp_none_means_on_policy():
    logp = t([[-1.0, -0.3, -2.0], [-0.7, -5.0, -5.0]])
    a, _ = grpo_loss(logp, None, None, t(ADV), MASK, beta=0.0, eps_low=0.2, eps_high=0.2)
    assert a.item() == pytest.approx(0.5)


def _clip_case(eps_high=0.2):
    # Row 0 has A = +1, row 1 has A = -1; old log-probs 0, so r = exp(logp).
    r = [[1.5, 0.5], [0.5, 1.5]]
    logp = t([[math.log(x) for x in row] for row in r], grad=True)
    loss, m = grpo_loss(
        logp, t([[0.0, 0.0], [0.0, 0.0]]), None, t([1.0, -1.0]), torch.ones(2, 2),
        beta=0.0, eps_low=0.2, eps_high=eps_high,
    )
    return logp, loss, m


def test_grpo_clipping_cases_and_clip_fraction():
    logp, loss, m = _clip_case()
    # row 0 (A=+1): r=1.5 > 1.2 clipped -> -1.2; r=0.5 not clipped (A>0 only clips above) -> -0.5
    # row 1 (A=-1): r=0.5 < 0.8 clipped -> +0.8; r=1.5 not clipped (A<0 only clips below) -> +1.5
    per_token = [[-1.2, -0.5], [0.8, 1.5]]
    assert loss.item() == pytest.approx(sum(sum(row) / 2 for row in per_token) / 2)
    assert m["clip/high"].item() == pytest.approx(1 / 4)
    assert m["clip/low"].item() == pytest.approx(1 / 4)
    assert m["clip/ratio"].item() == pytest.approx(2 / 4)
    loss.backward()
    # clipped tokens get no gradient; unclipped: d(-r A)/dlogp = -r A, times 1/(2 tokens * 2 seqs)
    assert_close(logp.grad, [[0.0, -0.5 / 4], [0.0, 1.5 / 4]])


def test_grpo_clip_higher_is_asymmetric():
    _, loss, m = _clip_case(eps_high=0.6)  # DAPO clip-higher: 1.5 < 1.6 is no longer clipped
    assert loss.item() == pytest.approx(((-1.5 - 0.5) / 2 + (0.8 + 1.5) / 2) / 2)
    assert m["clip/high"].item() == 0.0 and m["clip/low"].item() == pytest.approx(1 / 4)


def test_grpo_kl_term_with_each_estimator():
    # r = 1 and A = 0, so the loss is only beta * KL; d = ref - logp = [-1, 0.5] on the 2 real tokens.
    logp = t([[-1.0, -1.0, -3.0]], grad=True)
    ref = t([[-2.0, -0.5, -7.0]], grad=True)
    mask = torch.tensor([[1, 1, 0]])
    k3 = [math.exp(-1.0) + 1.0 - 1.0, math.exp(0.5) - 0.5 - 1.0]
    loss, m = grpo_loss(logp, logp.detach(), ref, t([0.0]), mask, beta=0.5, eps_low=0.2, eps_high=0.2)
    assert loss.item() == pytest.approx(0.5 * sum(k3) / 2)
    assert m["loss/kl"].item() == pytest.approx(0.5 * sum(k3) / 2)
    assert m["kl/ref"].item() == pytest.approx(sum(k3) / 2)
    assert m["loss/policy"].item() == 0.0
    loss.backward()
    # d k3 / d logp = 1 - exp(ref - logp); ref gets no gradient
    assert_close(logp.grad, [[0.5 * (1 - math.exp(-1.0)) / 2, 0.5 * (1 - math.exp(0.5)) / 2, 0.0]])
    assert ref.grad is None

    k1, m1 = grpo_loss(logp, logp.detach(), ref, t([0.0]), mask, beta=0.5, eps_low=0.2, eps_high=0.2, kl_estimator="k1")
    assert k1.item() == pytest.approx(0.5 * (1.0 + -0.5) / 2)  # k1 = logp - ref
    assert m1["kl/ref"].item() == pytest.approx(sum(k3) / 2)  # the logged KL is always k3
    k2, _ = grpo_loss(logp, logp.detach(), ref, t([0.0]), mask, beta=0.5, eps_low=0.2, eps_high=0.2, kl_estimator="k2")
    assert k2.item() == pytest.approx(0.5 * (0.5 * 1.0 + 0.5 * 0.25) / 2)


def test_grpo_beta_zero_logs_kl_without_loss_term():
    logp = t([[-1.0, -1.0]])
    ref = t([[-2.0, -0.5]])
    loss, m = grpo_loss(logp, logp, ref, t([1.0]), torch.ones(1, 2), beta=0.0, eps_low=0.2, eps_high=0.2)
    assert loss.item() == pytest.approx(-1.0)
    assert m["loss/kl"].item() == 0.0
    assert m["kl/ref"].item() == pytest.approx((math.exp(-1.0) + math.exp(0.5) - 0.5 - 1.0) / 2)


def test_grpo_total_is_policy_plus_kl_and_grads_only_reach_policy():
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(4, 5, generator=g, dtype=torch.float64)).requires_grad_()
    old = (logp.detach() + 0.3 * torch.randn(4, 5, generator=g, dtype=torch.float64)).requires_grad_()
    ref = (-torch.rand(4, 5, generator=g, dtype=torch.float64)).requires_grad_()
    adv = torch.randn(4, generator=g, dtype=torch.float64).requires_grad_()
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0]])
    for agg in ("grpo", "dapo", "dr_grpo"):
        loss, m = grpo_loss(
            logp, old, ref, adv, mask, beta=0.1, eps_low=0.2, eps_high=0.28, loss_agg=agg, max_completion_length=5
        )
        assert m["loss/total"].item() == pytest.approx(m["loss/policy"].item() + m["loss/kl"].item())
        assert m["loss/total"].item() == pytest.approx(loss.item())
        assert_metrics_detached_scalars(m)
        loss.backward()
    assert logp.grad is not None and logp.grad.abs().sum() > 0
    assert old.grad is None and ref.grad is None and adv.grad is None


def test_grpo_garbage_at_masked_positions_is_harmless():
    nan, inf = float("nan"), float("inf")
    logp = t([[-1.0, nan], [-0.5, inf]], grad=True)
    old = t([[-1.0, -inf], [-0.4, nan]])
    ref = t([[-1.2, 1e6], [-0.5, -inf]])
    mask = torch.tensor([[True, False], [True, False]])
    loss, m = grpo_loss(logp, old, ref, t([1.0, -1.0]), mask, beta=0.1, eps_low=0.2, eps_high=0.2)
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(v) for v in m.values())
    assert torch.isfinite(logp.grad).all() and logp.grad[:, 1].tolist() == [0.0, 0.0]


def test_grpo_dapo_num_active_tokens_makes_accumulation_match_one_batch():
    g = torch.Generator().manual_seed(1)
    logp = -torch.rand(4, 3, generator=g, dtype=torch.float64)
    old = logp + 0.1 * torch.randn(4, 3, generator=g, dtype=torch.float64)
    adv = torch.randn(4, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 0, 0]])
    kw = dict(beta=0.0, eps_low=0.2, eps_high=0.2, loss_agg="dapo")
    full, _ = grpo_loss(logp, old, None, adv, mask, **kw)
    n = mask.sum()
    halves = [
        grpo_loss(logp[s], old[s], None, adv[s], mask[s], num_active_tokens=n, **kw)[0]
        for s in (slice(0, 2), slice(2, 4))
    ]
    assert (halves[0] + halves[1]).item() == pytest.approx(full.item())


def test_grpo_argument_errors():
    logp = t([[-1.0, -1.0]])
    kw = dict(beta=0.0, eps_low=0.2, eps_high=0.2)
    with pytest.raises(ValueError, match="max_completion_length"):
        grpo_loss(logp, logp, None, t([1.0]), torch.ones(1, 2), loss_agg="dr_grpo", **kw)
    with pytest.raises(ValueError, match="loss_agg"):
        grpo_loss(logp, logp, None, t([1.0]), torch.ones(1, 2), loss_agg="bnpo", **kw)
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(logp, logp, None, t([[1.0, 1.0]]), torch.ones(1, 2), **kw)
    with pytest.raises(ValueError, match="kl_estimator"):
        grpo_loss(logp, logp, logp, t([1.0]), torch.ones(1, 2), kl_estimator="k5", **kw)


def test_grpo_half_precision_inputs_give_float32_loss():
    logp = t([[-1.0, -1.0]]).bfloat16().requires_grad_()
    adv = t([1.0]).bfloat16()
    loss, _ = grpo_loss(logp, None, logp.detach(), adv, torch.ones(1, 2), beta=0.1, eps_low=0.2, eps_high=0.2)
    assert loss.dtype == torch.float32
    loss.backward()
    assert logp.grad.dtype == torch.bfloat16


# ---------------------------------------------------------------- DPO

# x = (pc - pr) - (rc - rr) = [1.0, -1.5]; with beta = 0.5, beta x = [0.5, -0.75]
PC, PR, RC, RR = [-1.0, -3.0], [-2.0, -1.0], [-1.5, -2.0], [-1.5, -1.5]
BX = [0.5, -0.75]


def _dpo(**kw):
    return dpo_loss(t(PC), t(PR), t(RC), t(RR), beta=0.5, **kw)


def test_dpo_sigmoid_and_label_smoothing():
    loss, m = _dpo()
    assert loss.item() == pytest.approx(sum(softplus(-z) for z in BX) / 2)
    eps = 0.1
    loss, _ = _dpo(label_smoothing=eps)
    assert loss.item() == pytest.approx(sum((1 - eps) * softplus(-z) + eps * softplus(z) for z in BX) / 2)


def test_dpo_robust():
    eps = 0.1
    loss, _ = _dpo(loss_type="robust", label_smoothing=eps)
    expected = sum(((1 - eps) * softplus(-z) - eps * softplus(z)) / (1 - 2 * eps) for z in BX) / 2
    assert loss.item() == pytest.approx(expected)
    assert _dpo(loss_type="robust")[0].item() == pytest.approx(_dpo()[0].item())  # eps = 0: plain DPO


def test_dpo_hinge_and_ipo():
    assert _dpo(loss_type="hinge")[0].item() == pytest.approx((0.5 + 1.75) / 2)  # relu(1 - beta x)
    assert _dpo(loss_type="ipo")[0].item() == pytest.approx(((1.0 - 1.0) ** 2 + (-1.5 - 1.0) ** 2) / 2)


def test_dpo_ipo_averages_by_length():
    lc, lr = [2.0, 4.0], [4.0, 2.0]
    loss, m = _dpo(loss_type="ipo", chosen_lengths=torch.tensor(lc), rejected_lengths=torch.tensor([4, 2]))
    x = [(PC[i] / lc[i] - PR[i] / lr[i]) - (RC[i] / lc[i] - RR[i] / lr[i]) for i in range(2)]
    assert x == pytest.approx([0.375, -0.5])
    assert loss.item() == pytest.approx(sum((xi - 1.0) ** 2 for xi in x) / 2)
    assert m["logps/chosen"].item() == pytest.approx((-0.5 + -0.75) / 2)
    # other loss types ignore lengths
    same, _ = _dpo(chosen_lengths=torch.tensor(lc), rejected_lengths=torch.tensor(lr))
    assert same.item() == pytest.approx(_dpo()[0].item())


def test_dpo_metrics():
    _, m = _dpo()
    chosen = [0.5 * (PC[i] - RC[i]) for i in range(2)]  # [0.25, -0.5]
    rejected = [0.5 * (PR[i] - RR[i]) for i in range(2)]  # [-0.25, 0.25]
    assert m["rewards/chosen"].item() == pytest.approx(sum(chosen) / 2)
    assert m["rewards/rejected"].item() == pytest.approx(sum(rejected) / 2)
    assert m["rewards/margins"].item() == pytest.approx((sum(chosen) - sum(rejected)) / 2)
    assert m["rewards/accuracies"].item() == pytest.approx(0.5)
    assert m["logps/chosen"].item() == pytest.approx(-2.0)
    assert m["logps/rejected"].item() == pytest.approx(-1.5)
    assert m["loss/total"].item() == pytest.approx(_dpo()[0].item())
    assert_metrics_detached_scalars(m)


def test_dpo_gradients_reach_policy_only():
    pc, pr, rc, rr = t(PC, True), t(PR, True), t(RC, True), t(RR, True)
    loss, _ = dpo_loss(pc, pr, rc, rr, beta=0.5)
    loss.backward()
    # d/dpc of softplus(-beta x) / B = -beta * sigmoid(-beta x) / B
    sig = lambda z: 1 / (1 + math.exp(-z))  # noqa: E731
    assert pc.grad.tolist() == pytest.approx([-0.5 * sig(-z) / 2 for z in BX])
    assert pr.grad.tolist() == pytest.approx([0.5 * sig(-z) / 2 for z in BX])
    assert rc.grad is None and rr.grad is None


def test_dpo_argument_errors():
    with pytest.raises(ValueError, match="loss_type"):
        _dpo(loss_type="kto")
    with pytest.raises(ValueError, match="label_smoothing"):
        _dpo(loss_type="ipo", label_smoothing=0.1)
    with pytest.raises(ValueError, match="label_smoothing"):
        _dpo(loss_type="robust", label_smoothing=0.5)
    with pytest.raises(ValueError, match="rejected_lengths"):
        _dpo(loss_type="ipo", chosen_lengths=torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(t(PC), t(PR), t(RC), t(RR), beta=0.0)


# ---------------------------------------------------------------- SimPO

# a = pc/|c| = [-2, -1], b = pr/|r| = [-2, -2]; beta = 2, gamma = 1: beta z = 2(a - b) - 1 = [-1, 1]
SPC, SPR, SLC, SLR = [-4.0, -3.0], [-6.0, -2.0], [2, 3], [3, 1]


def _simpo(pc=None, pr=None, **kw):
    pc = t(SPC) if pc is None else pc
    pr = t(SPR) if pr is None else pr
    return simpo_loss(pc, pr, torch.tensor(SLC), torch.tensor(SLR), beta=2.0, gamma=1.0, **kw)


def test_simpo_loss_and_metrics():
    loss, m = _simpo()
    assert loss.item() == pytest.approx((softplus(1.0) + softplus(-1.0)) / 2)
    assert m["rewards/chosen"].item() == pytest.approx(2 * (-2 + -1) / 2)
    assert m["rewards/rejected"].item() == pytest.approx(2 * (-2 + -2) / 2)
    assert m["rewards/margins"].item() == pytest.approx(1.0)
    assert m["rewards/accuracies"].item() == pytest.approx(0.5)  # a tie (-4 vs -4) is not a win
    assert m["logps/chosen"].item() == pytest.approx(-1.5) and m["logps/rejected"].item() == pytest.approx(-2.0)
    assert_metrics_detached_scalars(m)
    eps = 0.2
    smoothed, _ = _simpo(label_smoothing=eps)
    expected = ((1 - eps) * softplus(1.0) + eps * softplus(-1.0) + (1 - eps) * softplus(-1.0) + eps * softplus(1.0)) / 2
    assert smoothed.item() == pytest.approx(expected)


def test_simpo_gradients():
    pc, pr = t(SPC, True), t(SPR, True)
    loss, _ = _simpo(pc, pr)
    loss.backward()
    sig = lambda z: 1 / (1 + math.exp(-z))  # noqa: E731
    # d/dpc softplus(-beta z) = -beta sigmoid(-beta z) / |c|, averaged over B = 2
    assert pc.grad.tolist() == pytest.approx([-2 * sig(1.0) / 2 / 2, -2 * sig(-1.0) / 3 / 2])
    assert pr.grad.tolist() == pytest.approx([2 * sig(1.0) / 3 / 2, 2 * sig(-1.0) / 1 / 2])


# ---------------------------------------------------------------- ORPO


def test_orpo_loss_and_metrics():
    pc, pr = t([-1.0, -3.0], True), t([-2.0, -1.0], True)
    lc, lr = torch.tensor([2, 3]), torch.tensor([2, 2])
    a, b = [-0.5, -1.0], [-1.0, -0.5]
    log_odds = [(a[i] - b[i]) - (math.log(1 - math.exp(a[i])) - math.log(1 - math.exp(b[i]))) for i in range(2)]
    nll = t(0.7, True)
    loss, m = orpo_loss(pc, pr, lc, lr, nll, lam=0.1)
    or_term = 0.1 * sum(softplus(-lo) for lo in log_odds) / 2  # lam * mean(-log sigmoid)
    assert loss.item() == pytest.approx(0.7 + or_term)
    assert m["loss/nll"].item() == pytest.approx(0.7) and m["loss/or"].item() == pytest.approx(or_term)
    assert m["orpo/log_odds_ratio"].item() == pytest.approx(sum(log_odds) / 2)
    assert m["orpo/log_sigmoid_odds"].item() == pytest.approx(-sum(softplus(-lo) for lo in log_odds) / 2)
    assert m["rewards/chosen"].item() == pytest.approx(0.1 * (-0.5 + -1.0) / 2)
    assert m["rewards/rejected"].item() == pytest.approx(0.1 * (-1.0 + -0.5) / 2)
    assert m["rewards/accuracies"].item() == pytest.approx(0.5)
    assert_metrics_detached_scalars(m)
    loss.backward()
    assert nll.grad.item() == pytest.approx(1.0)
    assert torch.isfinite(pc.grad).all() and pc.grad.abs().sum() > 0
    # per-sequence NLL [B] is averaged
    loss_b, _ = orpo_loss(pc, pr, lc, lr, t([0.6, 0.8]), lam=0.1)
    assert loss_b.item() == pytest.approx(0.7 + or_term)


def test_orpo_log1mexp_stable_near_zero():
    # an average log-prob just below 0 (probability ~1): log(1 - e^a) = log(-expm1(a))
    a = -1e-9
    pc, pr = t([a], True), t([-3.0], True)
    _, m = orpo_loss(pc, pr, torch.tensor([1]), torch.tensor([1]), t(0.0), lam=1.0)
    expected = (a + 3.0) - (math.log(-math.expm1(a)) - math.log(1 - math.exp(-3.0)))
    assert m["orpo/log_odds_ratio"].item() == pytest.approx(expected, rel=1e-9)
    loss, _ = orpo_loss(pc, pr, torch.tensor([1]), torch.tensor([1]), t(0.0), lam=1.0)
    loss.backward()
    assert torch.isfinite(pc.grad).all() and torch.isfinite(pr.grad).all()


# ---------------------------------------------------------------- NLL-only and RPO
def test_nll_only_loss_is_the_chosen_nll_and_reports_the_policys_preference():
    from refexp.losses import nll_only_loss

    pc, pr = t([-3.0, -1.0], grad=True), t([-2.0, -4.0], grad=True)
    nll = t(1.25, grad=True)
    loss, m = nll_only_loss(pc, pr, nll)
    assert loss.item() == 1.25 and m["loss/nll"].item() == 1.25 and m["loss/total"].item() == 1.25
    assert m["rewards/accuracies"].item() == 0.5 and m["rewards/margins"].item() == pytest.approx((-1 + 3) / 2)
    loss.backward()
    assert nll.grad.item() == 1.0 and pc.grad is None  # the rejected and chosen sums only feed metrics
    per_pair, _ = nll_only_loss(pc, pr, t([1.0, 1.5]))  # micro-batch parts: their mean
    assert per_pair.item() == pytest.approx(1.25)


def test_rpo_adds_the_weighted_chosen_nll_to_the_preference_loss():
    from refexp.losses import add_nll_term

    pc, pr, rc, rr = t([-1.0, -2.0], grad=True), t([-2.0, -2.5], grad=True), t([-1.5, -2.0]), t([-1.8, -2.2])
    dpo, m = dpo_loss(pc, pr, rc, rr, beta=0.1)
    total, m2 = add_nll_term(dpo, m, t(0.8), 0.5)
    assert total.item() == pytest.approx(dpo.item() + 0.4)
    assert m2["loss/nll"].item() == pytest.approx(0.8) and m2["loss/total"].item() == pytest.approx(total.item())
    assert m2["rewards/margins"] is m["rewards/margins"]  # the preference metrics are the DPO loss's


# ---------------------------------------------------------------- from algo.loss_type to the loss
@pytest.mark.parametrize("loss_type, nll_weight", [(lt, 0.0) for lt in PREFERENCE_LOSSES] + [
    (lt, 0.5) for lt in PREFERENCE_LOSSES if lt not in ("orpo", "sft")])  # those two are NLL losses already
def test_preference_loss_dispatches_each_loss_type_to_its_loss(loss_type, nll_weight):
    from types import SimpleNamespace

    from refexp.losses import add_nll_term, nll_only_loss, preference_loss

    pc, pr, rc, rr = t([-1.0, -2.0]), t([-2.0, -2.5]), t([-1.5, -2.0]), t([-1.8, -2.2])
    lc, lr, nll = torch.tensor([2, 3]), torch.tensor([4, 1]), t(0.8)
    s = SimpleNamespace(loss_type=loss_type, beta=0.3, gamma=0.2, lam=0.4, label_smoothing=0.0, nll_weight=nll_weight)
    loss, m = preference_loss(s, pc, pr, lc, lr, rc, rr, nll)
    direct = {"sft": lambda: nll_only_loss(pc, pr, nll),
              "orpo": lambda: orpo_loss(pc, pr, lc, lr, nll, lam=0.4),
              "simpo": lambda: simpo_loss(pc, pr, lc, lr, beta=0.3, gamma=0.2)}.get(
        loss_type, lambda: dpo_loss(pc, pr, rc, rr, beta=0.3, loss_type=loss_type, chosen_lengths=lc,
                                    rejected_lengths=lr))
    expected, em = direct()
    if nll_weight:
        expected, em = add_nll_term(expected, em, nll, nll_weight)
        assert m["loss/nll"].item() == pytest.approx(0.8)
    assert loss.item() == expected.item() and m.keys() == em.keys()
