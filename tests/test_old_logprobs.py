"""What GRPO's clip ratio is taken against (``algo.old_logprobs``) in a bfloat16 forward on CPU, where the
built-in engine's KV-cache decode and the trainer's forward differ by bf16 rounding: the default (auto) takes
the trainer's log-probs, as on a GPU; rollout takes the engine's; ``algo.tis_cap`` takes the trainer's and
weights each token by the capped ratio to the engine's."""

from __future__ import annotations

import pytest
import torch

from refexp.algos.grpo import ratio_against_trainer
from refexp.config import ConfigError, GRPOConfig
from refexp.record.metrics import read_metrics
from refexp.run import run
from tests.helpers.configs import TINY_GRPO_OVERRIDES, compose_tiny_run

BF16 = [*TINY_GRPO_OVERRIDES, "training.steps=1", "eval.every=1", "eval.log_samples=0", "reference=none",
        "training.mixed_precision_param=bfloat16",
        "task.ops=[+]"]  # the addition-only start, whose bf16 mismatch these thresholds were set on


def _first_update(tmp_path, monkeypatch, *overrides) -> tuple[dict, dict]:
    """The first chunk's (logp, ratio base, token weight, mask) as handed to ``grpo_loss``, and step 1's metrics."""
    import refexp.algos.grpo as grpo_mod

    seen: list[dict] = []
    original = grpo_mod.grpo_loss

    def record(logp, old_logp, ref_logp, adv, mask, **kw):
        seen.append({"logp": logp.detach().clone(), "base": old_logp.detach().clone(), "mask": mask.bool(),
                     "weight": kw.get("token_weight")})
        return original(logp, old_logp, ref_logp, adv, mask, **kw)

    monkeypatch.setattr(grpo_mod, "grpo_loss", record)
    run(compose_tiny_run(tmp_path, *BF16, *overrides))
    return seen[0], next(r for r in read_metrics(tmp_path) if r["step"] == 1)


@pytest.mark.slow
def test_the_bf16_default_takes_the_ratio_against_the_trainer(tmp_path, monkeypatch):
    got, row = _first_update(tmp_path, monkeypatch)
    assert row["rollout/logprob_diff"] > 1e-3  # bf16: the engine's log-probs are not the trainer's
    m = got["mask"]
    assert torch.equal(got["base"][m], got["logp"][m])  # ratio exactly 1 on the first update
    assert got["weight"] is None


@pytest.mark.slow
def test_rollout_takes_the_engines_logprobs(tmp_path, monkeypatch):
    got, row = _first_update(tmp_path, monkeypatch, "algo.old_logprobs=rollout")
    m = got["mask"]
    # the ratio base is the engine's: over this chunk it is as far from the trainer's as logprob_diff says
    diff = (got["logp"][m].float() - got["base"][m].float()).abs().mean()
    assert float(diff) > 1e-3
    assert float(diff) == pytest.approx(row["rollout/logprob_diff"], rel=0.5)


@pytest.mark.slow
def test_tis_takes_the_trainers_and_weights_by_the_capped_ratio(tmp_path, monkeypatch):
    got, row = _first_update(tmp_path, monkeypatch, "algo.tis_cap=1.01")
    m = got["mask"]
    assert torch.equal(got["base"][m], got["logp"][m])
    w = got["weight"][m]
    assert float(w.max()) <= 1.01 and bool((w != 1).any())  # bf16's mismatch reaches the weights


def test_auto_follows_the_compute_dtype():
    assert ratio_against_trainer(GRPOConfig(), "bfloat16")
    assert not ratio_against_trainer(GRPOConfig(), "float32")
    assert ratio_against_trainer(GRPOConfig(old_logprobs="trainer"), "float32")
    assert not ratio_against_trainer(GRPOConfig(old_logprobs="rollout"), "bfloat16")
    assert ratio_against_trainer(GRPOConfig(tis_cap=2.0), "float32")
    with pytest.raises(ConfigError, match="algo.old_logprobs"):
        GRPOConfig(old_logprobs="rollout", tis_cap=2.0)
    with pytest.raises(ConfigError, match="algo.old_logprobs"):
        GRPOConfig(old_logprobs="engine")
