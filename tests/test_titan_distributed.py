"""refexp.titan on 2 gloo processes vs one process: FSDP (dp_shard=2) and TP=2, llama3 and qwen3.

One ``torchrun --standalone --nproc_per_node=2`` launch of tests/titan_dist_worker.py runs every
check (start-up dominates: ~10 s of imports per process); each test below reads its numbers.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("titan_dist_worker.py")
TOL = 1e-5
CHECKS = ("logprobs_grads", "lerp", "lerp_unresharded", "decode", "hf_roundtrip")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("titan_dist")
    out = workdir / "results.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(WORKER),
           str(out), str(workdir)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0 and out.exists(), f"torchrun failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    return json.loads(out.read_text())


@pytest.mark.parametrize("layout", ["fsdp", "tp"])
@pytest.mark.parametrize("name", ["llama3", "qwen3"])
@pytest.mark.parametrize("check", CHECKS)
def test_matches_single_process(results, layout, name, check):
    """logprobs_grads: log-probs, entropies and gradients; lerp: EMA step and exact reset (also
    right after a forward with fsdp_reshard_after_forward=never, when FSDP holds full weights);
    decode: KV-cache (FSDP) / recompute (TP) decoding; hf_roundtrip: export_hf and load_hf_weights_."""
    err = results[f"{layout}/{name}/{check}"]
    assert isinstance(err, float), err  # a traceback string when the check raised
    assert err <= TOL, f"{layout}/{name}/{check}: max abs error {err:.3g} vs single process"
