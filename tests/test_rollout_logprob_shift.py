"""A rollout engine whose log-probs are shifted by a known amount from the trainer's (the built-in engine in
fp32 agrees with the trainer within 1e-4): ``rollout/logprob_diff`` is the mean absolute difference, and
``algo.tis_cap``'s truncated importance weight min(pi_trainer / pi_rollout, cap) reaches the gradient."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from refexp.logging import read_metrics
from refexp.run import run
from tests.helpers import GRPO, compose_cfg

RUN = [*GRPO, "training.steps=1", "eval.every=1", "eval.log_samples=0"]


@pytest.fixture
def shift_engine_logprobs(monkeypatch):
    """``install(shift)`` makes the built-in engine add ``shift(mask_BT)`` [N, T-1] to its behaviour log-probs
    on the completion tokens of training rollouts; returns the list of (added shift, mask) per rollout."""
    from refexp import rollout

    added = []

    def install(shift):
        class Shifted(rollout.BuiltinEngine):
            def generate(self, prompts, **kw):
                r = super().generate(prompts, **kw)
                keys = kw.get("keys") or []
                if not keys or len(keys[0]) != 4:  # not a training rollout: (seed, step, prompt id, sample id)
                    return r
                d = torch.where(r.mask_BT, shift(r.mask_BT), torch.zeros(()))
                added.append((d, r.mask_BT))
                return dataclasses.replace(r, behaviour_logp=r.behaviour_logp + d)

        monkeypatch.setitem(rollout.ENGINES, "builtin", Shifted)
        return added

    return install


@pytest.fixture
def recorded_grads(monkeypatch):
    """Every GRPO optimizer step's gradients, by parameter name, as the step hands them over."""
    import refexp.algos.grpo as grpo_mod

    steps: list[dict[str, torch.Tensor]] = []
    original = grpo_mod.optimizer_step

    def record(ctx, policy, loss, step, ckpt):
        steps.append({n: p.grad.detach().clone() for n, p in policy.model.named_parameters()})
        return original(ctx, policy, loss, step, ckpt)

    monkeypatch.setattr(grpo_mod, "optimizer_step", record)
    return steps


def _step_1(run_dir) -> dict:
    return next(r for r in read_metrics(run_dir / "metrics.jsonl") if r["step"] == 1)


def test_logprob_diff_is_the_mean_absolute_difference(tmp_path, shift_engine_logprobs):
    """Even rows' engine log-probs raised by 0.5, odd rows' lowered by 1.0: the differences have both signs, so
    a signed mean (or the absolute value of one) would differ from the documented mean of |trainer - engine|."""
    c = 0.5
    added = shift_engine_logprobs(lambda m: torch.where(torch.arange(m.shape[0])[:, None] % 2 == 0, c, -2 * c)
                                  .expand(m.shape))
    run(compose_cfg(tmp_path, *RUN))
    (d, mask), = added
    n_tok = mask.sum()
    want = float(d.abs().sum() / n_tok)
    signed = float(-d.sum() / n_tok)  # trainer - engine = -d up to fp32 noise
    assert abs(abs(signed) - want) > 0.1  # the case tells the definitions apart
    row = _step_1(tmp_path)
    assert row["rollout/logprob_diff"] == pytest.approx(want, abs=1e-3)
    assert row["rollout/logprob_diff_max"] == pytest.approx(2 * c, abs=1e-3)


def test_the_capped_importance_weight_scales_the_policy_gradient(tmp_path, dense_reward, recorded_grads,
                                                                 shift_engine_logprobs):
    """The engine's log-probs ln 10 below the trainer's: every token's weight is min(10, tis_cap=2) = 2. The
    first update's clip ratio is taken against the trainer's own log-probs (r = 1), so without a KL term
    (reference=none; TIS does not weight it) its gradient is exactly twice the on-policy gradient of the same
    batch (the unshifted run without TIS, whose ratio is 1 within the engine's 1e-4)."""
    base = [*RUN, "reference=none"]
    run(compose_cfg(tmp_path / "plain", *base))
    shift_engine_logprobs(lambda m: torch.full(m.shape, -math.log(10.0)))
    run(compose_cfg(tmp_path / "tis", *base, "algo.tis_cap=2.0"))
    (plain,), (tis,) = recorded_grads[:1], recorded_grads[1:]
    scale = max(float(g.abs().max()) for g in plain.values())
    assert scale > 0  # advantages are non-zero (dense_reward): the policy gradient is not trivially 0
    worst = max(float((tis[k] - 2.0 * plain[k]).abs().max()) for k in plain)
    assert worst <= 1e-3 * scale, f"gradient differs from 2x the on-policy one by {worst / scale:.3g} of its size"
    assert _step_1(tmp_path / "tis")["rollout/logprob_diff"] == pytest.approx(math.log(10.0), abs=1e-3)
