"""What each rank would read from the shared filesystem on its own is decided once, by rank 0, and every rank
follows it (``distributed.decided_by_rank0``): 2 gloo processes, rank 1 shown another answer than rank 0
(tests/helpers/decisions_worker.py). And HF export does not hold other ranks in a collective while rank 0 writes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "helpers" / "decisions_worker.py"


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    workdir = tmp_path_factory.mktemp("decisions")
    out = workdir / "results.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                                                     os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(WORKER),
           str(out), str(workdir)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0 and out.exists(), f"torchrun failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    return json.loads(out.read_text())


def test_the_sft_cache_hit_is_rank0s(results):
    assert results["sft_cache_hit"] == [{"dir": "key-0", "trained": 0}] * 2


def test_the_kind_and_folder_of_a_weights_dir_are_rank0s(results):
    assert results["weights_kind"] == [["dcp:step-0"]] * 2


def test_rank0s_error_is_raised_on_every_rank(results):
    assert results["rank0_error"] == ["ConfigError: rank 0 found no checkpoint"] * 2


def test_hf_export_waits_for_rank0s_files_past_the_collective_timeout(results):
    assert results["export_waits"] == [["model.safetensors"]] * 2
