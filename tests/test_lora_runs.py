"""GRPO with a LoRA policy (``model.lora``) end to end on the embedded task: it runs and logs ``kl/ref`` and
``kl/init`` (the same view of the same model for ``reference=fixed``), its checkpoints hold the adapters only, a
resumed run equals an uninterrupted one with the reference's state (a reset's reference adapter, an EMA's delta),
and FSDP on 2 processes equals 1 process. The small runs of tests/test_resume.py and tests/test_distributed.py."""

from __future__ import annotations

import pytest

from refexp.record.metrics import read_metrics
from refexp.run import run
from refexp.titan.dcp_reader import checked_dcp_metadata
from tests.helpers.configs import SMALL_GRPO_OVERRIDES, SMALL_RUN_OVERRIDES, compose_small_run
from tests.helpers.runs import assert_same_metrics, assert_same_row, metrics_by_step, run_status, torchrun

pytestmark = pytest.mark.slow

LORA = [*SMALL_GRPO_OVERRIDES, "model.lora.rank=4", "model.lora.alpha=16", "training.lr=1e-2"]
REFS = {
    "fixed": ["reference=fixed"],
    "periodic_reset": ["reference=periodic_reset", "reference.reset_every=2"],
    "ema": ["reference=ema", "reference.alpha=0.5"],
}
N = 6


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Uninterrupted single-process LoRA runs of N steps (checkpoints every step), in the session's cache."""
    cache = tmp_path_factory.getbasetemp() / "refexp-cache"  # conftest's session cache
    out = tmp_path_factory.mktemp("lora")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REFEXP_CACHE", str(cache))
        for ref, overrides in REFS.items():
            run(compose_small_run(out / ref, *LORA, *overrides, f"training.steps={N}", "checkpoint.interval=1",
                                  "checkpoint.keep_latest_k=2"))
    return {"cache": cache, "single": out, "tmp": tmp_path_factory.mktemp("lora-multi")}


def test_a_lora_run_trains_the_adapters_and_measures_against_the_base(env):
    rows = metrics_by_step(env["single"] / "fixed")
    assert sorted(rows) == list(range(N + 1)) and run_status(env["single"] / "fixed")["status"] == "completed"
    assert rows[N]["kl/init"] > 1e-4 and rows[N]["kl/ref"] > 1e-4  # the adapters moved the policy from its start
    assert abs(rows[1]["kl/ref"]) < 1e-9  # B = 0 at step 1: the policy is the base the reference reads
    assert all(rows[step]["ref/version"] == 0 for step in range(N + 1))
    keys = checked_dcp_metadata(env["single"] / "fixed" / "checkpoint" / f"step-{N}").state_dict_metadata
    weights = [k for k in keys if k.endswith(".weight") and not k.startswith("optimizer")]
    assert weights and all(".lora_a." in k or ".lora_b." in k for k in weights)  # the frozen base is not saved
    reset = metrics_by_step(env["single"] / "periodic_reset")
    assert reset[3]["kl/ref"] == pytest.approx(0.0, abs=1e-6) and reset[4]["ref/version"] == 2  # reset at 2 and 4
    assert reset[4]["kl/ref"] > 0


@pytest.mark.parametrize("ref, K", [("periodic_reset", 5), ("ema", 3)])
def test_a_resumed_lora_run_equals_the_uninterrupted_one(env, ref, K, tmp_path):
    """Stopped after step K and rerun to N: steps K+1..N as uninterrupted, the reference's part restored from the
    checkpoint: step 6 reads the reference adapter of the reset at 4 (the adapters are still 0 at the reset at 2,
    where no reward has varied yet); the EMA's delta carries every update since step 1."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REFEXP_CACHE", str(env["cache"]))
        common = [*LORA, *REFS[ref], "checkpoint.interval=1", "checkpoint.keep_latest_k=2"]
        run(compose_small_run(tmp_path, *common, f"training.steps={K}"))
        run(compose_small_run(tmp_path, *common, f"training.steps={N}"))
    got, want = metrics_by_step(tmp_path, in_order=True), metrics_by_step(env["single"] / ref, in_order=True)
    assert sorted(got) == list(range(N + 1))
    for step in range(K + 1, N + 1):
        assert_same_row(got[step], want[step], other_order=False, tol=1e-6, where=f"step {step}")
    assert [r["step"] for r in read_metrics(tmp_path)] == list(range(N + 1))


@pytest.mark.numerics
def test_lora_on_two_fsdp_processes_equals_one(env):
    """One torchrun launch: the EMA run (its delta is the product of the gathered A and this rank's rows of B)."""
    sweep = env["tmp"] / "fsdp"
    torchrun("-m", *SMALL_RUN_OVERRIDES, *LORA, *REFS["ema"], f"training.steps={N}", "parallelism=fsdp",
             f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=ema", cache=env["cache"])
    assert run_status(sweep / "ema")["status"] == "completed"
    assert_same_metrics(sweep / "ema", env["single"] / "ema", other_order=True)
