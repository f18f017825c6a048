"""KL and reference options do what they say: tempered reference log-probs, an adaptive beta that counts
samples, k1 in the reward and never in the loss, no kl/beta without a reference, and ProRL's optimizer reset."""

from __future__ import annotations

import pytest
import torch

from refexp.config import ConfigError, to_object
from refexp.record.metrics import read_metrics
from refexp.run import run
from tests.helpers.configs import TINY_GRPO_OVERRIDES, compose_tiny_run

ROWS_PER_STEP = 4 * 4  # TINY_GRPO_OVERRIDES: 4 prompts x 4 completions


def _rows(tmp_path, *overrides):
    run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, *overrides))
    return {r["step"]: r for r in read_metrics(tmp_path)}


def test_reference_logprobs_are_tempered_like_the_policy(tmp_path):
    """At step 1 the policy is the fixed reference, so the KL between them is 0 at any temperature
    (untempered reference log-probs against tempered behaviour ones read ~1e-2 at T=0.7)."""
    rows = _rows(tmp_path, "reference=fixed", "algo.temperature=0.7", "training.steps=1")
    assert rows[1]["kl/ref"] < 1e-6


def test_adaptive_beta_counts_the_global_batch_rows_against_the_horizon(tmp_path, dense_reward):
    """Ziegler et al. 2019 / TRL: beta <- beta (1 + clip(kl/target - 1, +-0.2) n / horizon), n in samples."""
    rows = _rows(tmp_path, "reference=fixed", "algo.beta=0.1", "algo.kl_target=0.001", "algo.kl_horizon=200",
                 "training.steps=4")
    beta = 0.1
    for step in range(1, 5):
        assert rows[step]["kl/beta"] == pytest.approx(beta, rel=1e-9)  # the beta this step's loss used
        e = min(max(rows[step]["kl/ref"] / 0.001 - 1.0, -0.2), 0.2)
        beta *= 1.0 + e * ROWS_PER_STEP / 200
    assert rows[4]["kl/beta"] != pytest.approx(0.1, rel=1e-3)  # it moved


def test_k1_in_the_loss_is_refused_with_the_reason(tiny_grpo_cfg):
    with pytest.raises(ConfigError, match=r"algo.kl_estimator.*zero expected gradient"):
        tiny_grpo_cfg.algo.kl_estimator = "k1"
        to_object(tiny_grpo_cfg)


def test_kl_in_reward_uses_k1_whatever_the_loss_estimator(tmp_path, dense_reward):
    """With the penalty in the reward the loss has no KL term, so the estimator field changes nothing."""
    common = ("reference=fixed", "algo.kl_in_reward=true", "algo.beta=0.5", "training.steps=3")
    k3 = _rows(tmp_path / "k3", *common, "algo.kl_estimator=k3")
    k2 = _rows(tmp_path / "k2", *common, "algo.kl_estimator=k2")
    for step in (1, 2, 3):
        assert k3[step]["reward/shaped_mean"] == pytest.approx(k2[step]["reward/shaped_mean"], abs=1e-7)
        assert k3[step]["loss/kl"] == 0.0
    # the penalty is applied once the policy has moved away from the reference
    assert k3[3]["reward/shaped_mean"] < k3[3]["reward/mean"]


def test_kl_beta_is_logged_only_with_a_reference(tmp_path):
    assert all("kl/beta" not in r for r in _rows(tmp_path / "none", "reference=none").values())
    assert all("kl/beta" in r for s, r in _rows(tmp_path / "fixed", "reference=fixed").items() if s > 0)


@pytest.mark.parametrize("reset_optimizer, adam_steps", [(True, [1, 2, 1, 2]), (False, [1, 2, 3, 4])])
def test_reset_optimizer_empties_the_optimizer_state_at_a_reset(tmp_path, monkeypatch, reset_optimizer,
                                                                adam_steps):
    """ProRL (Liu et al. 2025): with ``reset_optimizer`` a reference reset also clears Adam's moments, so the
    step after it restarts bias correction (Adam's ``step`` counts from 1 again); without it the state is kept."""
    import refexp.algos.loop as loop

    seen: list[int] = []
    real = loop.clip_and_step

    def recording(model, optimizers, *args, **kwargs):
        out = real(model, optimizers, *args, **kwargs)
        states = [st for opt in optimizers for st in opt.state.values()]
        assert states, "the optimizer holds state after a step"
        seen.append(int(torch.as_tensor(states[0]["step"]).item()))
        return out

    monkeypatch.setattr(loop, "clip_and_step", recording)
    _rows(tmp_path, "reference=periodic_reset", "reference.reset_every=2",
          f"reference.reset_optimizer={str(reset_optimizer).lower()}", "training.steps=4")
    assert seen == adam_steps
