"""refexp.titan on 2 gloo processes vs one process: FSDP (dp_shard=2) and TP=2, llama3 and qwen3; and
FSDP x TP 2 x 2 on 4 processes for what the 2-D layout adds (decoding, HF loading).

One ``torchrun --standalone --nproc_per_node=2`` launch of tests/helpers/titan_dist_worker.py runs every
check (start-up, each process's imports, dominates), one 4-process launch the 2 x 2 checks;
each test below reads its numbers.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.numerics]

ROOT = Path(__file__).resolve().parents[1]
# Started by path with the repository root on PYTHONPATH (it imports tests.helpers.models).
WORKER = ROOT / "tests" / "helpers" / "titan_dist_worker.py"
TOL = 1e-5
CHECKS = ("logprobs_grads", "logprobs_grads_selected", "shared_rows", "shared_rows_selected", "exact_kl", "lerp",
          "lerp_unresharded", "decode", "generate", "hf_roundtrip")
CHECKS_2X2 = ("exact_kl", "decode", "generate", "hf_roundtrip")  # 4 processes: only what FSDP x TP adds


def launch(workdir: Path, nproc: int, *checks: str) -> dict:
    out = workdir / "results.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                                                     os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(WORKER),
           str(out), str(workdir), *([",".join(checks)] if checks else [])]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0 and out.exists(), f"torchrun failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return launch(tmp_path_factory.mktemp("titan_dist"), 2)


@pytest.fixture(scope="module")
def results_2x2(tmp_path_factory):
    return launch(tmp_path_factory.mktemp("titan_dist_2x2"), 4, *CHECKS_2X2)


@pytest.mark.parametrize("layout", ["fsdp", "tp"])
@pytest.mark.parametrize("name", ["llama3", "qwen3"])
@pytest.mark.parametrize("check", CHECKS)
def test_matches_single_process(results, layout, name, check):
    """logprobs_grads: log-probs, entropies and gradients (``_selected``: computed only at a selection of
    positions, ``select_BT``; under TP that is the vocab-parallel full path, zeroed off the selection);
    lerp: EMA step and exact reset (also right after a forward with fsdp_reshard_after_forward=never, when FSDP
    holds full weights);
    shared_rows: prompt sharing through gathered usual rows (``titan.CausalRows``), log-probs and gradients
    (``_selected``: the output layer only at the completion columns);
    exact_kl: the exact per-position KL against a frozen model (``titan.token_kl``, ``kl/init_exact``);
    decode: KV-cache decoding (TP: each rank caches its own heads); generate: greedy and sampled
    completions token for token; hf_roundtrip: export_hf into an
    indexed file set and load_hf_weights_ back, each rank reading only its own shards."""
    err = results[f"{layout}/{name}/{check}"]
    assert isinstance(err, float), err  # a traceback string when the check raised
    assert err <= TOL, f"{layout}/{name}/{check}: max abs error {err:.3g} vs single process"


@pytest.mark.parametrize("name", ["llama3", "qwen3"])
@pytest.mark.parametrize("check", CHECKS_2X2)
def test_fsdp_tp_2x2_matches_single_process(results_2x2, name, check):
    """FSDP x TP on 4 ranks (parameters row-sharded as FSDP's ``_StridedShard`` over TP's ``Shard(0)``): the
    exact KL's output layer gathered over both mesh dims, KV-cache decoding and generation on each TP group's
    heads, and an HF load in which each rank reads exactly its own elements (the fused Q/K/V fused from local
    shards)."""
    err = results_2x2[f"fsdp_tp/{name}/{check}"]
    assert isinstance(err, float), err
    assert err <= TOL, f"fsdp_tp/{name}/{check}: max abs error {err:.3g} vs single process"
