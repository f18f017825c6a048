"""What GRPO's clip ratio is taken against (``algo.old_logprobs``) in a bfloat16 forward: the default (auto)
takes the trainer's log-probs, as on a GPU; rollout takes the engine's; ``algo.tis_cap`` takes the trainer's
and weights each token by the capped ratio to the engine's.

The engine's and the trainer's bf16 log-probs differ by a rounding error whose size is the CPU's (about 1e-3
with AVX-512-BF16/AMX kernels, 5e-4 on others, 1e-8 under ``ATEN_CPU_CAPABILITY=default``), so no test leans
on it: the engine's log-probs are shifted by a known ``OFFSET``, far larger than any rounding, and each test
checks whether the ratio sees that offset.
"""

from __future__ import annotations

import pytest
import torch

from refexp.algos.grpo import ratio_against_trainer
from refexp.config import ConfigError, GRPOConfig
from refexp.record.metrics import read_metrics
from refexp.run import run
from tests.helpers.configs import TINY_GRPO_OVERRIDES, compose_tiny_run
from tests.helpers.engine_recording import shift_behaviour_logprobs

pytestmark = pytest.mark.numerics  # tests/README.md: run under other CPU kernels too

BF16 = [*TINY_GRPO_OVERRIDES, "training.steps=1", "eval.every=1", "eval.log_samples=0", "reference=none",
        "training.mixed_precision_param=bfloat16"]
OFFSET = -0.25
"""Added to every completion token's engine log-prob: the trainer / engine ratio becomes exp(0.25) ≈ 1.28
times whatever bf16 rounding makes it (a factor within 1 ± 0.01 on every CPU seen)."""
ROUNDING = 0.02
"""A bound on the bf16 engine/trainer mismatch, per token, on any CPU: far below |OFFSET|."""


def _first_update(tmp_path, monkeypatch, *overrides) -> tuple[dict, dict]:
    """The first chunk's (logp, ratio base, token weight, mask, the shifted engine log-probs) as handed to
    ``grpo_loss``, and step 1's metrics, in a run whose rollout engine reports its log-probs + ``OFFSET``."""
    import refexp.algos.grpo as grpo_mod

    rollouts, _ = shift_behaviour_logprobs(monkeypatch, lambda mask_BT: torch.full(mask_BT.shape, OFFSET))
    seen: list[dict] = []
    original = grpo_mod.grpo_loss

    def record(logp, old_logp, ref_logp, adv, mask, **kw):
        engine = rollouts[-1].rollout.behaviour_logp[: logp.shape[0]]  # this step's rollout, as the step got it
        seen.append({"logp": logp.detach().clone(), "base": old_logp.detach().clone(), "mask": mask.bool(),
                     "weight": kw.get("token_weight"), "engine": engine})
        return original(logp, old_logp, ref_logp, adv, mask, **kw)

    monkeypatch.setattr(grpo_mod, "grpo_loss", record)
    run(compose_tiny_run(tmp_path, *BF16, *overrides))
    return seen[0], next(r for r in read_metrics(tmp_path) if r["step"] == 1)


@pytest.mark.slow
def test_the_bf16_default_takes_the_ratio_against_the_trainer(tmp_path, monkeypatch):
    got, row = _first_update(tmp_path, monkeypatch)
    m = got["mask"]
    assert torch.equal(got["base"][m], got["logp"][m])  # the offset is not seen: ratio exactly 1
    assert got["weight"] is None
    # and the offset is there to be seen: logprob_diff measures it
    assert row["rollout/logprob_diff"] == pytest.approx(abs(OFFSET), abs=ROUNDING)


@pytest.mark.slow
def test_rollout_takes_the_engines_logprobs(tmp_path, monkeypatch):
    got, row = _first_update(tmp_path, monkeypatch, "algo.old_logprobs=rollout")
    m = got["mask"]
    assert torch.equal(got["base"][m], got["engine"][m].to(got["base"].dtype))  # the ratio base is the engine's
    # so the ratio sees the offset: log(trainer / base) = -OFFSET, up to bf16 rounding
    log_ratio = (got["logp"][m].float() - got["base"][m].float())
    assert float(log_ratio.mean()) == pytest.approx(-OFFSET, abs=ROUNDING)
    assert row["rollout/logprob_diff"] == pytest.approx(abs(OFFSET), abs=ROUNDING)


@pytest.mark.slow
def test_tis_takes_the_trainers_and_weights_by_the_capped_ratio(tmp_path, monkeypatch):
    cap = 1.2  # below exp(-OFFSET) / exp(ROUNDING): the cap binds on every token
    got, row = _first_update(tmp_path, monkeypatch, f"algo.tis_cap={cap}")
    m = got["mask"]
    assert torch.equal(got["base"][m], got["logp"][m])
    w = got["weight"][m]
    assert torch.equal(w, torch.exp(got["base"][m] - got["engine"][m]).clamp(max=cap))
    assert bool((w == cap).all())  # the offset reaches the weights, truncated at the cap


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
