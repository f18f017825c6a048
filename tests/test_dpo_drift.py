"""DPO's drift measures: ``kl/ref`` comparable with GRPO's, ``kl/ref_chosen_tokens``, likelihood displacement.

``kl/ref`` of a DPO run is KL(policy || current reference) on the policy's samples of the ``kl/init``
held-out prompts, measured on the evaluation schedule before the step's reference update
(refexp/algos/dpo.py, refexp/algos/loop.py); the step logs ``kl/ref_chosen_tokens`` instead.
One run per strategy (a module-scoped fixture) serves every assertion; tiny configs from tests/helpers/configs.py.
"""

from __future__ import annotations

import pytest
import torch

from refexp import titan
from refexp.components.evaluation import reference_logprobs
from refexp.config import ModelConfig
from refexp.config.reference import FixedReferenceConfig
from refexp.record.metrics import read_metrics
from refexp.reference.anchor import InitAnchor
from refexp.reference.strategies import build_reference
from refexp.run import run
from tests.helpers.configs import compose_tiny_run

DPO = ["algo=dpo", "algo.num_pairs=32", "algo.pairs_per_step=8", "training.steps=4", "training.lr=1e-3"]
EVAL_STEPS = (0, 2, 4)  # eval.every=2 (TINY_RUN_OVERRIDES) and the end
RUNS = {
    "fixed": ["reference=fixed"],
    "fixed_precomputed": ["reference=fixed", "algo.precompute_ref=true"],
    # not the kl/init anchor (another dtype): built for each measurement and released again
    "fixed_precomputed_bf16": ["reference=fixed", "algo.precompute_ref=true", "reference.dtype=bfloat16"],
    "periodic_reset": ["reference=periodic_reset", "reference.reset_every=2"],
    "ema": ["reference=ema", "reference.alpha=0.5"],
    # evals at 0, 3, 4: the step's chosen-token KL is > 0 at step 2, which must not trigger a reset
    "kl_triggered": ["reference=kl_triggered", "reference.kl_threshold=1e-9", "reference.min_gap=1",
                     "eval.every=3"],
    "simpo": ["reference=none", "algo.loss_type=simpo"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[dict]]:
    cache = tmp_path_factory.getbasetemp() / "refexp-cache"  # conftest's session cache
    out = tmp_path_factory.mktemp("drift")
    rows = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REFEXP_CACHE", str(cache))
        for name, overrides in RUNS.items():
            run(compose_tiny_run(out / name, *DPO, *overrides))
            rows[name] = read_metrics(out / name)
            assert [r["step"] for r in rows[name]] == [0, 1, 2, 3, 4]
    return rows


def eval_steps(name: str) -> tuple[int, ...]:
    return (0, 3, 4) if name == "kl_triggered" else EVAL_STEPS


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_drift_measures_on_the_eval_schedule(runs, name):
    rows, evals = runs[name], eval_steps(name)
    has_ref = name != "simpo"
    for r in rows:
        measured = r["step"] in evals
        for k in ("kl/init", "eval/logp_correct", "logps/chosen_delta"):
            assert (k in r) == measured, (name, r["step"], k)
        assert ("kl/ref" in r) == (measured and has_ref), (name, r["step"])  # never from the DPO step
        # the step's chosen-token diagnostic, every training step with a reference
        assert ("kl/ref_chosen_tokens" in r) == (r["step"] > 0 and has_ref), (name, r["step"])
        if measured:
            assert r["eval/logp_correct"] < 0
    assert rows[0]["kl/init"] == 0.0 and rows[0]["logps/chosen_delta"] == 0.0
    assert rows[-1]["logps/chosen_delta"] != 0.0  # the policy moved the chosen log-probs
    if has_ref and name != "fixed_precomputed_bf16":
        assert rows[0]["kl/ref"] == pytest.approx(0.0, abs=1e-7)  # every reference starts at the policy


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fixed", "fixed_precomputed"])
def test_fixed_reference_kl_ref_is_kl_init(runs, name):
    rows = runs[name]
    for s in EVAL_STEPS:
        assert rows[s]["kl/ref"] == pytest.approx(rows[s]["kl/init"], abs=1e-6)
    assert rows[-1]["kl/ref"] > 1e-6
    assert all(r["mem/ref_params"] == 0.0 for r in rows[1:]) == (name == "fixed_precomputed")


@pytest.mark.slow
def test_released_reference_is_built_for_the_measurement(runs):
    """A bfloat16 copy of the start checkpoint: kl/ref close to kl/init, no reference model resident."""
    rows = runs["fixed_precomputed_bf16"]
    for s in EVAL_STEPS:
        assert 0 < rows[s]["kl/ref"] == pytest.approx(rows[s]["kl/init"], abs=1e-2)
    assert all(r["mem/ref_params"] == 0.0 for r in rows[1:])


@pytest.mark.slow
def test_eval_measures_the_reference_of_its_step(runs):
    """Step 2's eval runs before the reset of step 2: the reference is still the initial model."""
    rows = runs["periodic_reset"]
    assert rows[2]["kl/ref"] == pytest.approx(rows[2]["kl/init"], abs=1e-6) and rows[2]["ref/version"] == 1.0
    assert rows[4]["kl/ref"] < rows[4]["kl/init"]  # against the step-2 policy: less drift than from the start
    assert rows[3]["kl/ref_chosen_tokens"] == pytest.approx(0.0, abs=1e-6)  # step 3's batch: policy == reference


@pytest.mark.slow
def test_kl_triggered_resets_only_when_kl_ref_is_measured(runs):
    rows = runs["kl_triggered"]
    assert rows[2]["kl/ref_chosen_tokens"] > 1e-9  # above the threshold, but not the measured kl/ref
    assert [r["ref/version"] for r in rows] == [0.0, 0.0, 0.0, 1.0, 2.0]
    assert {r["ref/last_update_step"] for r in rows} == {0.0, 3.0, 4.0}


# ---------------------------------------------------------------- the log-prob functions
def _tiny_model(seed: int) -> torch.nn.Module:
    cfg = ModelConfig(dim=32, n_layers=2, n_heads=2, n_kv_heads=2, ffn_hidden_dim=64, max_seq_len=32)
    return titan.build_model(cfg, vocab_size=40, device="cpu", seed=seed, requires_grad=False)


def test_anchor_and_released_reference_are_tempered_and_released():
    tokens = torch.randint(0, 40, (3, 10), generator=torch.Generator().manual_seed(0))
    model = _tiny_model(1)
    want = titan.token_logprobs(model, tokens, temperature=0.7)
    with InitAnchor(lambda: model).logprobs() as fn:
        torch.testing.assert_close(fn(tokens, temperature=0.7), want, rtol=0, atol=0)
    builds = []
    strategy = build_reference(FixedReferenceConfig(), lambda: builds.append(1) or model, defer_build=True)
    assert strategy.model is None  # as after DPO's precompute released it
    with reference_logprobs(strategy) as fn:
        assert strategy.model is model
        torch.testing.assert_close(fn(tokens, temperature=0.7), want, rtol=0, atol=0)
    assert strategy.model is None and builds == [1]
