"""The rollout engine's log-probs against the trainer's: the mismatch metric, and truncated importance
sampling (Yao et al. 2025) as its correction."""

from __future__ import annotations

import math

import pytest
import torch

from refexp.losses import grpo_loss
from refexp.record.metrics import read_metrics
from refexp.run import run
from tests.helpers.configs import TINY_GRPO_OVERRIDES, compose_tiny_run

pytestmark = pytest.mark.numerics  # tests/README.md: run under other CPU kernels too


def test_token_weights_scale_each_tokens_policy_loss_exactly():
    """TIS: l[b, t] = -min(r A, clip(r) A) * w[b, t]; the KL term is not weighted."""
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.7]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.1, -1.8], [-0.5, -0.9]], dtype=torch.float64)
    ref = torch.tensor([[-1.2, -2.1], [-0.4, -0.8]], dtype=torch.float64)
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 0]])
    w = torch.tensor([[0.5, 2.0], [1.5, 9.0]], dtype=torch.float64)
    kw = dict(beta=0.1, eps_low=0.2, eps_high=0.2, loss_agg="dapo")
    loss, m = grpo_loss(logp, old, ref, adv, mask, token_weight=w, **kw)

    def token(b, t):
        r = math.exp(logp[b, t].item() - old[b, t].item())
        a = adv[b].item()
        return -min(r * a, min(max(r, 0.8), 1.2) * a)

    policy = sum(token(b, t) * w[b, t].item() for b, t in [(0, 0), (0, 1), (1, 0)]) / 3
    assert m["loss/policy"].item() == pytest.approx(policy, rel=1e-12)
    unweighted, m0 = grpo_loss(logp, old, ref, adv, mask, **kw)
    assert m["loss/kl"].item() == pytest.approx(m0["loss/kl"].item(), rel=1e-12)  # the KL term is not reweighted
    assert loss.item() == pytest.approx(policy + m0["loss/kl"].item(), rel=1e-12)


# one skill and no pass@k: the counts below are those of accuracy's evaluations (retention and pass@k add their own)
RUN = [*TINY_GRPO_OVERRIDES, "training.steps=2", "eval.every=2", "eval.log_samples=0", "task.ops=[+]", "eval.pass_k=0"]


def _rows(tmp_path, *overrides):
    run(compose_tiny_run(tmp_path, *RUN, *overrides))
    return [r for r in read_metrics(tmp_path) if r["step"] > 0]


@pytest.mark.slow
def test_the_builtin_engine_in_fp32_matches_the_trainer_and_tis_then_changes_nothing(tmp_path):
    plain = _rows(tmp_path / "plain")
    for r in plain:
        assert 0 <= r["rollout/logprob_diff"] <= r["rollout/logprob_diff_max"] < 1e-4
    tis = _rows(tmp_path / "tis", "algo.tis_cap=2.0")
    # the weights are exp(<1e-4) = 1 within 1e-4, and the ratio base differs by as little: the same run
    for a, b in zip(plain, tis):
        assert b["loss/total"] == pytest.approx(a["loss/total"], abs=1e-4)
        assert b["reward/mean"] == a["reward/mean"]


@pytest.mark.slow
def test_bf16_compute_reports_its_mismatch(tmp_path):
    rows = _rows(tmp_path, "training.mixed_precision_param=bfloat16")
    for r in rows:
        assert math.isfinite(r["rollout/logprob_diff"]) and r["rollout/logprob_diff_max"] >= r["rollout/logprob_diff"]
    assert max(r["rollout/logprob_diff"] for r in rows) > 0  # bf16 rollouts and training forwards differ


@pytest.mark.slow
def test_grpo_evaluation_and_dpo_pairs_all_generate_through_the_configured_engine(tmp_path, monkeypatch):
    """The rollout-engine seam: every generation of a run goes through rollout.name's engine."""
    from refexp.components import rollout
    calls = []

    class Recording(rollout.BuiltinEngine):
        def generate(self, prompts, **kw):
            calls.append("greedy" if kw.get("greedy") else "sampled")
            return super().generate(prompts, **kw)

    run(compose_tiny_run(tmp_path / "warm", *RUN, "training.steps=0"))  # the SFT stage (its evaluations) cached first
    monkeypatch.setitem(rollout.ENGINES, "builtin", Recording)
    _rows(tmp_path / "grpo")
    # step 0 and step 2 evaluations (greedy accuracy on test and validation, kl/init samples) and two GRPO
    # steps' rollouts
    assert calls.count("greedy") == 2 * 2 and calls.count("sampled") == 2 + 2
    calls.clear()
    run(compose_tiny_run(tmp_path / "dpo", "algo=dpo", "algo.pairs_per_step=4", "algo.num_pairs=16",
                    "training.steps=1", "eval.every=1", "eval.log_samples=0"))
    assert calls.count("sampled") >= 1 + 2  # the pairs of the SFT model, then kl/init at steps 0 and 1
