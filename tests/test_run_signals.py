"""SIGTERM to a real run in the SFT stage (before the training loop: it used to leave ``running``, exit 143)
and in the training loop ends with ``preempted``; the lock and the SFT cache entry are left clean."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from refexp.record import layout
from refexp.record.metrics import read_metrics
from refexp.record.status import read_status
from tests.helpers.configs import TINY_GRPO_OVERRIDES, TINY_RUN_OVERRIDES

ROOT = Path(__file__).resolve().parents[1]


def _start(tmp_path: Path, run_dir: Path, *overrides: str) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", REFEXP_CACHE=str(tmp_path / "cache"))  # an SFT stage of its own
    with open(tmp_path / "run.log", "w") as log:
        return subprocess.Popen([sys.executable, "-m", "refexp", *TINY_RUN_OVERRIDES, *TINY_GRPO_OVERRIDES,
                                 f"run_dir={run_dir}", *overrides],
                                env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def _terminate_when(pred, proc: subprocess.Popen, tmp_path: Path) -> int:
    end = time.monotonic() + 180
    try:
        while not pred():
            assert proc.poll() is None and time.monotonic() < end, (tmp_path / "run.log").read_text()[-3000:]
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        return proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_sigterm_in_the_sft_stage_is_preempted(tmp_path):
    run_dir = tmp_path / "run"
    sft = tmp_path / "cache" / "sft"
    proc = _start(tmp_path, run_dir, "sft.steps=100000", "sft.eval_every=100000")
    # the stage trains into a temporary dir of the cache, and logs its steps there
    rc = _terminate_when(lambda: any(read_metrics(d) for d in sft.glob(".tmp-*")), proc, tmp_path)
    assert rc != 0 and rc != -signal.SIGTERM, (tmp_path / "run.log").read_text()[-3000:]
    status = read_status(run_dir)
    assert status["status"] == "preempted" and "SIGTERM" in status["error"], status
    assert not (run_dir / layout.LOCK).exists()
    assert not list(sft.glob(".tmp-*")) and not list(sft.glob("*.lock"))  # no half-made model, no held lock


@pytest.mark.slow
def test_sigterm_in_the_training_loop_is_preempted(tmp_path):
    run_dir = tmp_path / "run"
    proc = _start(tmp_path, run_dir, "training.steps=100000", "eval.every=100000")
    rc = _terminate_when(lambda: any(r["step"] >= 2 for r in read_metrics(run_dir)), proc, tmp_path)
    assert rc != 0, (tmp_path / "run.log").read_text()[-3000:]
    status = read_status(run_dir)
    last = max(r["step"] for r in read_metrics(run_dir))
    assert status["status"] == "preempted" and status["last_step"] == last, status
    assert (run_dir / "checkpoint" / f"step-{last}").is_dir()
    assert not (run_dir / layout.LOCK).exists()
