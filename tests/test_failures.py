"""A rank that fails ends its job quickly, and ``status.json`` says failed with that rank's error.

Rank 1 raises in GRPO's second step (``tests/helpers/rewards.py:fails_on_rank1_at_step2``) while
rank 0 goes on into the step's collectives; the job must end within a minute of the failure, started
by refexp itself (torch's elastic agent) or by torchrun, and the run dir must name the root cause,
not rank 0's "Connection closed by peer". Fast unit tests of ``refexp/record/status.py`` come first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from refexp.record import status as rstatus
from refexp.record.status import read_status
from tests.helpers.configs import TINY_GRPO_OVERRIDES, TINY_RUN_OVERRIDES

ROOT = Path(__file__).resolve().parents[1]
FAILING = [*TINY_RUN_OVERRIDES, *TINY_GRPO_OVERRIDES, "training.steps=6", "parallelism=fsdp",
           "task.reward=tests.helpers.rewards:fails_on_rank1_at_step2"]


# ---------------------------------------------------------------- status.json's rules, no processes
def test_rank_failure_is_kept_over_rank0s_later_error(tmp_path):
    rstatus.close_status(tmp_path, {"status": "running", "error": None})
    rstatus.record_rank_failure(tmp_path, 1, {"status": "failed", "error": "KeyError: boom", "traceback": "tb1"})
    written = rstatus.close_status(tmp_path, {"status": "failed", "error": "RuntimeError: Connection closed by peer"})
    assert written["error"] == "rank 1: KeyError: boom" and written["failed_rank"] == 1
    assert written["rank0_error"] == "RuntimeError: Connection closed by peer"
    assert read_status(tmp_path) == written


def test_first_rank_failure_wins(tmp_path):
    rstatus.record_rank_failure(tmp_path, 1, {"status": "failed", "error": "first"})
    rstatus.record_rank_failure(tmp_path, 2, {"status": "failed", "error": "second"})
    assert rstatus.read_status(tmp_path)["error"] == "rank 1: first"


def test_launch_failure_only_fills_a_gap(tmp_path):
    rstatus.close_status(tmp_path, {"status": "running", "error": None, "algo": "grpo"})
    rstatus.record_launch_failure(tmp_path, "rank 1 exited with code -9: Signal 9 (SIGKILL)")
    got = rstatus.read_status(tmp_path)
    assert got["status"] == "failed" and "SIGKILL" in got["error"] and got["algo"] == "grpo"
    rstatus.record_launch_failure(tmp_path, "something later")
    assert "SIGKILL" in rstatus.read_status(tmp_path)["error"]


def test_rank0s_own_failure_is_written_as_is(tmp_path):
    rstatus.close_status(tmp_path, {"status": "running", "error": None})
    written = rstatus.close_status(tmp_path, {"status": "failed", "error": "ValueError: x"})
    assert written["error"] == "ValueError: x" and "failed_rank" not in written


# ---------------------------------------------------------------- the training timeout
def _timeout_worker(rank: int, port: int, out: str) -> None:
    import torch

    from refexp.runtime import distributed as rdist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    rdist.init_distributed(torch.device("cpu"), backend="gloo", timeout_s=300)
    rdist.set_collective_timeout(2)
    rdist.note_run_failed()  # no teardown at exit: the peer is gone or late
    if rank == 1:
        time.sleep(8)  # a peer that stopped answering
        return
    t0 = time.monotonic()
    try:
        torch.distributed.all_reduce(torch.ones(1))
        result = "no timeout"
    except Exception as e:  # gloo's timeout
        result = f"{type(e).__name__}: {e}"
    Path(out).write_text(json.dumps({"waited": time.monotonic() - t0, "error": result}))
    # leave without interpreter finalisation: destroying gloo's pair of a group whose peer is gone can abort the
    # process (std::terminate) after the result is written, which mp.spawn would report as this rank's failure
    os._exit(0)


@pytest.mark.slow
def test_collectives_time_out_after_the_training_timeout(tmp_path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "rank0.json"
    mp.spawn(_timeout_worker, args=(port, str(out)), nprocs=2, join=True)
    got = json.loads(out.read_text())
    assert got["error"] != "no timeout" and got["waited"] < 6, got


# ---------------------------------------------------------------- 2-process jobs
def _run_failing_job(args: list[str], run_dir: Path) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="1")
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=240, cwd=ROOT)
    return proc, time.time()


def _assert_failed_fast(proc: subprocess.CompletedProcess, ended: float, run_dir: Path) -> None:
    assert proc.returncode != 0, proc.stdout[-2000:]
    st = read_status(run_dir)
    assert st["status"] == "failed", st
    assert "injected failure on rank 1" in st["error"], st["error"]
    assert st["failed_rank"] == 1
    assert ended - st["ended"] < 60, f"the job ended {ended - st['ended']:.0f} s after rank 1 failed"


@pytest.mark.slow
def test_failing_rank_ends_a_spawned_job(tmp_path):
    run_dir = tmp_path / "run"
    proc, ended = _run_failing_job([sys.executable, "-m", "refexp", *FAILING, "parallelism.nproc_per_node=2",
                                    f"run_dir={run_dir}"], run_dir)
    _assert_failed_fast(proc, ended, run_dir)


@pytest.mark.slow
def test_failing_rank_ends_a_torchrun_job(tmp_path):
    run_dir = tmp_path / "run"
    proc, ended = _run_failing_job([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                    "--nproc_per_node=2", "-m", "refexp", *FAILING, f"run_dir={run_dir}"], run_dir)
    _assert_failed_fast(proc, ended, run_dir)
