"""KL estimators and controllers against values worked out by hand with `math`."""

import math

import pytest
import torch

from refexp.losses.kl import (
    kl_estimate,
    masked_mean,
    mean_token_kl,
    sequence_kl,
)
from refexp.reference.kl_control import AdaptiveKLController, FixedKLController

pytestmark = pytest.mark.numerics  # tests/README.md: run under other CPU kernels too


def t(x):
    return torch.tensor(x, dtype=torch.float64)


# logp and ref at three sampled tokens; d = ref - logp = [-0.5, 1.0, 0.0]
LOGP = [-1.0, -2.0, -0.5]
REF = [-1.5, -1.0, -0.5]
D = [r - p for p, r in zip(LOGP, REF)]


@pytest.mark.parametrize(
    "estimator, expected",
    [
        ("k1", [-d for d in D]),  # logp - ref
        ("k2", [0.5 * d * d for d in D]),
        ("k3", [math.exp(d) - d - 1 for d in D]),
    ],
)
def test_estimators_on_known_numbers(estimator, expected):
    assert expected[0] == pytest.approx({"k1": 0.5, "k2": 0.125, "k3": math.exp(-0.5) - 0.5}[estimator])
    out = kl_estimate(t(LOGP), t(REF), estimator)
    assert out.tolist() == pytest.approx(expected, abs=1e-12)


def test_k3_nonnegative_and_all_zero_when_equal():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(64, 16, generator=g) * 5
    ref = -torch.rand(64, 16, generator=g) * 5
    assert (kl_estimate(logp, ref, "k3") >= 0).all()
    assert (kl_estimate(logp, ref, "k2") >= 0).all()
    assert (kl_estimate(logp, ref, "k1") < 0).any()  # k1 is unbiased but not pointwise >= 0
    for est in ("k1", "k2", "k3"):
        assert torch.equal(kl_estimate(logp, logp, est), torch.zeros_like(logp))


def test_estimators_estimate_kl_policy_to_ref():
    """Sampling from the policy p, mean k1 and k3 approach KL(p || q), not KL(q || p)."""
    p = [0.9, 0.05, 0.05]
    q = [0.4, 0.3, 0.3]
    kl_pq = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))
    kl_qp = sum(qi * math.log(qi / pi) for pi, qi in zip(p, q))
    assert abs(kl_pq - kl_qp) > 0.1  # the two directions are distinguishable
    g = torch.Generator().manual_seed(0)
    x = torch.multinomial(torch.tensor(p), 200_000, replacement=True, generator=g)
    logp = torch.tensor(p, dtype=torch.float64).log()[x]
    ref = torch.tensor(q, dtype=torch.float64).log()[x]
    for est in ("k1", "k3"):
        assert kl_estimate(logp, ref, est).mean().item() == pytest.approx(kl_pq, abs=0.01)


def test_estimator_errors():
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_estimate(t(LOGP), t(REF), "k4")
    with pytest.raises(ValueError, match="same shape"):
        kl_estimate(t(LOGP), t(REF[:2]), "k3")


def test_kl_promotes_half_precision():
    out = kl_estimate(t(LOGP).bfloat16(), t(REF).bfloat16(), "k3")
    assert out.dtype == torch.float32


def test_masked_mean():
    x = t([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert masked_mean(x, mask).item() == pytest.approx((1 + 2 + 3 + 4) / 4)
    assert masked_mean(x, mask, dim=-1).tolist() == pytest.approx([2.0, 4.0])
    assert masked_mean(x, mask.bool(), dim=0).tolist() == pytest.approx([2.5, 2.0, 3.0])
    assert masked_mean(x, torch.zeros_like(mask)).item() == 0.0  # empty mask: 0, not NaN


def test_masked_positions_never_leak_values_or_nan_gradients():
    logp = t([[-1.0, float("inf")], [-0.5, float("nan")]]).requires_grad_()
    ref = t([[-2.0, float("-inf")], [-0.5, 1e6]])
    mask = torch.tensor([[True, False], [True, False]])
    kl = mean_token_kl(logp, ref, mask)
    assert kl.item() == pytest.approx((math.exp(-1.0) + 1 - 1 + 0.0) / 2)
    kl.backward()
    assert torch.isfinite(logp.grad).all()
    assert logp.grad[:, 1].tolist() == [0.0, 0.0]


def test_sequence_kl_sums_and_mean_token_kl_weighs_tokens():
    logp = t([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    ref = t([[-2.0, -0.5, -1.0], [-1.5, -9.0, -9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    k3 = lambda d: math.exp(d) - d - 1  # noqa: E731
    row0 = [k3(-1.0), k3(0.5), k3(0.0)]
    row1 = [k3(-0.5)]
    assert sequence_kl(logp, ref, mask).tolist() == pytest.approx([sum(row0), sum(row1)])
    assert sequence_kl(logp, ref, mask, estimator="k1").tolist() == pytest.approx([1.0 - 0.5 + 0.0, 0.5])
    token_mean = (sum(row0) + sum(row1)) / 4
    assert mean_token_kl(logp, ref, mask).item() == pytest.approx(token_mean)
    # ... which is not the mean of per-sequence means: long sequences weigh more.
    assert token_mean != pytest.approx((sum(row0) / 3 + sum(row1)) / 2)


def test_adaptive_controller_matches_ziegler_formula():
    c = AdaptiveKLController(init_beta=0.1, target=6.0, horizon=10000)
    # KL far above target: error clipped to +0.2, beta grows.
    assert c.update(12.0, n_steps=256) == pytest.approx(0.1 * (1 + 0.2 * 256 / 10000))
    b = c.beta
    # KL slightly below target: error 5.7/6 - 1 = -0.05, beta shrinks.
    assert c.update(torch.tensor(5.7), n_steps=256) == pytest.approx(b * (1 - 0.05 * 256 / 10000))
    b = c.beta
    # KL far below: error clipped to -0.2.
    assert c.update(0.0, n_steps=100) == pytest.approx(b * (1 - 0.2 * 100 / 10000))
    b = c.beta
    assert c.update(6.0, n_steps=100) == pytest.approx(b)  # at target: unchanged


def test_adaptive_controller_direction_over_many_steps():
    up = AdaptiveKLController(0.05, target=0.1, horizon=100)
    down = AdaptiveKLController(0.05, target=0.1, horizon=100)
    for _ in range(50):
        up.update(0.5, 1)
        down.update(0.01, 1)
    assert up.beta > 0.05 > down.beta > 0


def test_controller_state_roundtrip_and_errors():
    c = AdaptiveKLController(0.1, target=1.0, horizon=10)
    c.update(5.0, 3)
    d = AdaptiveKLController(0.1, target=1.0, horizon=10)
    d.load_state_dict(c.state_dict())
    assert d.beta == c.beta and d.update(2.0, 1) == c.update(2.0, 1)
    with pytest.raises(ValueError, match="current_kl"):
        c.update(float("nan"), 1)
    with pytest.raises(ValueError, match="target"):
        AdaptiveKLController(0.1, target=0.0, horizon=10)
    with pytest.raises(ValueError, match="horizon"):
        AdaptiveKLController(0.1, target=1.0, horizon=0)


def test_fixed_controller_same_interface_never_moves():
    c = FixedKLController(0.04)
    assert c.update(100.0, 10) == 0.04 and c.update(0.0, 10) == 0.04
    c.load_state_dict({"beta": 0.5})
    assert c.state_dict() == {"beta": 0.5}
    with pytest.raises(ValueError):
        FixedKLController(-1.0)


def _expected_loss_gradient(estimator: str, theta: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """E_{x~pi}[grad k(x)] computed exactly over a categorical: the sampling weights pi(x) are not
    differentiated, as when a loss term is averaged over sampled completions."""
    theta = theta.clone().requires_grad_(True)
    logp = torch.log_softmax(theta, -1)
    term = (logp.exp().detach() * kl_estimate(logp, ref_logp, estimator)).sum()
    (grad,) = torch.autograd.grad(term, theta)
    return grad


@pytest.mark.parametrize("estimator, divergence", [
    ("k1", None),                  # zero expected gradient: no regularisation
    ("k2", "kl(policy||ref)"),
    ("k3", "kl(ref||policy)"),
])
def test_each_estimator_expected_gradient_is_that_of_its_divergence(estimator, divergence):
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(7, generator=g, dtype=torch.float64)
    ref_logp = torch.log_softmax(torch.randn(7, generator=g, dtype=torch.float64), -1)

    got = _expected_loss_gradient(estimator, theta, ref_logp)

    t = theta.clone().requires_grad_(True)
    logp = torch.log_softmax(t, -1)
    if divergence is None:
        want = torch.zeros_like(theta)
    else:
        kl = ((logp.exp() * (logp - ref_logp)).sum() if divergence == "kl(policy||ref)"
              else (ref_logp.exp() * (ref_logp - logp)).sum())
        (want,) = torch.autograd.grad(kl, t)
    assert want.abs().max() > 1e-3 or divergence is None  # a real, non-vanishing gradient to compare against
    assert torch.allclose(got, want, atol=1e-12), (got, want)
    if estimator == "k3":  # and not that of KL(policy||ref), which differs here
        t2 = theta.clone().requires_grad_(True)
        p = torch.log_softmax(t2, -1)
        (other,) = torch.autograd.grad((p.exp() * (p - ref_logp)).sum(), t2)
        assert not torch.allclose(got, other, atol=1e-3)
