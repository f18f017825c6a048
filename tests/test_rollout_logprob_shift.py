"""A rollout engine whose log-probs are shifted by a known amount from the trainer's (the built-in engine in
fp32 agrees with the trainer within 1e-4): ``rollout/logprob_diff`` is the mean absolute difference, and
``algo.tis_cap``'s truncated importance weight min(pi_trainer / pi_rollout, cap) reaches the gradient."""

from __future__ import annotations

import math

import pytest
import torch

from refexp.record.metrics import read_metrics
from refexp.run import run
from tests.helpers.configs import TINY_GRPO_OVERRIDES, compose_tiny_run
from tests.helpers.engine_recording import by_row_parity, shift_behaviour_logprobs
from tests.helpers.grad_recording import largest, largest_difference, record_grpo_grads

pytestmark = pytest.mark.numerics  # tests/README.md: run under other CPU kernels too

RUN = [*TINY_GRPO_OVERRIDES, "training.steps=1", "eval.every=1", "eval.log_samples=0"]


def _step_1(run_dir) -> dict:
    return next(r for r in read_metrics(run_dir) if r["step"] == 1)


@pytest.mark.slow
def test_logprob_diff_is_the_mean_absolute_difference(tmp_path, monkeypatch):
    """Even rows' engine log-probs raised by 0.5, odd rows' lowered by 1.0: the differences have both signs, so
    a signed mean (or the absolute value of one) would differ from the documented mean of |trainer - engine|."""
    c = 0.5
    rollouts, shifts = shift_behaviour_logprobs(monkeypatch, by_row_parity(c, -2 * c))
    run(compose_tiny_run(tmp_path, *RUN))
    (r,), (d,) = rollouts, shifts
    n_tok = r.rollout.mask_BT.sum()
    want = float(d.abs().sum() / n_tok)
    signed = float(-d.sum() / n_tok)  # trainer - engine = -d up to fp32 noise
    assert abs(abs(signed) - want) > 0.1  # the case tells the definitions apart
    row = _step_1(tmp_path)
    assert row["rollout/logprob_diff"] == pytest.approx(want, abs=1e-3)
    assert row["rollout/logprob_diff_max"] == pytest.approx(2 * c, abs=1e-3)


@pytest.mark.slow
def test_the_capped_importance_weight_scales_the_policy_gradient(tmp_path, dense_reward, monkeypatch):
    """The engine's log-probs ln 10 below the trainer's: every token's weight is min(10, tis_cap=2) = 2. The
    first update's clip ratio is taken against the trainer's own log-probs (r = 1), so without a KL term
    (reference=none; TIS does not weight it) its gradient is exactly twice the on-policy gradient of the same
    batch (the unshifted run without TIS, whose ratio is 1 within the engine's 1e-4)."""
    recorded = record_grpo_grads(monkeypatch)
    base = [*RUN, "reference=none"]
    run(compose_tiny_run(tmp_path / "plain", *base))
    shift_behaviour_logprobs(monkeypatch, lambda m: torch.full(m.shape, -math.log(10.0)))
    run(compose_tiny_run(tmp_path / "tis", *base, "algo.tis_cap=2.0"))
    plain, tis = recorded
    scale = largest(plain)
    assert scale > 0  # advantages are non-zero (dense_reward): the policy gradient is not trivially 0
    worst = largest_difference(tis, {k: 2.0 * g for k, g in plain.items()})
    assert worst <= 1e-3 * scale, f"gradient differs from 2x the on-policy one by {worst / scale:.3g} of its size"
    assert _step_1(tmp_path / "tis")["rollout/logprob_diff"] == pytest.approx(math.log(10.0), abs=1e-3)
