"""Resume equals uninterrupted; kills during a save fall back to the last good checkpoint; SIGTERM saves.

A run stopped after step K (``training.steps=K``) and rerun in the same run dir with
``training.steps=N`` must log, for steps K+1..N, the metrics of an uninterrupted N-step run (within
TOL), and ``metrics.jsonl`` must hold every step once. The runs cross a periodic reset (every 2
steps) or EMA updates (every step), with the adaptive KL controller on (``algo.kl_target``, a short
horizon so beta moves), and a DPO run with an EMA reference.

Killing: a ``step-N`` folder without DCP's ``.metadata`` (what a SIGKILL during a save leaves) is
simulated exactly, and a real subprocess is SIGKILLed as soon as a ``step-N`` folder appears
without ``.metadata`` (or, if the save is too quick to catch, wherever it is). A SIGTERM'd
subprocess saves the step it was on and exits with status ``preempted``. ``keep_latest_k`` prunes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from refexp.record.metrics import read_metrics
from refexp.record.status import read_status
from refexp.run import run
from tests.helpers.configs import (
    CONF_DIR,
    SMALL_DPO_OVERRIDES,
    SMALL_GRPO_OVERRIDES,
    SMALL_RUN_OVERRIDES,
    compose_small_run,
)
from tests.helpers.processes import wait_for
from tests.helpers.runs import assert_same_row, metrics_by_step

pytestmark = pytest.mark.slow

TOL = 1e-6
K, N = 3, 6

CHECKPOINT_EVERY_STEP = ["checkpoint.interval=1", "checkpoint.keep_latest_k=2"]
GRPO_ADAPTIVE_KL = [*SMALL_GRPO_OVERRIDES, "algo.kl_target=0.01", "algo.kl_horizon=10"]
RUNS = {
    "grpo-periodic_reset": [*GRPO_ADAPTIVE_KL, "reference=periodic_reset", "reference.reset_every=2"],
    "grpo-ema": [*GRPO_ADAPTIVE_KL, "reference=ema", "reference.alpha=0.5"],
    "dpo-ema": [*SMALL_DPO_OVERRIDES, "reference=ema", "reference.alpha=0.5"],
}


def compose_resumable_run(run_dir: Path, *overrides: str):
    """A small run that saves a checkpoint every step and keeps the last two."""
    return compose_small_run(run_dir, *CHECKPOINT_EVERY_STEP, *overrides)


def assert_resumed_equal(run_dir: Path, want_dir: Path, first: int) -> None:
    """Steps first..N of run_dir equal the uninterrupted run's; every step 0..N is there once."""
    got, want = metrics_by_step(run_dir, in_order=True), metrics_by_step(want_dir, in_order=True)
    assert sorted(got) == list(range(N + 1))
    for step in range(first, N + 1):  # one process, the same arithmetic: every metric, thresholded ones too
        assert_same_row(got[step], want[step], other_order=False, tol=TOL, where=f"step {step}")


def ckpt_steps(run_dir: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in (run_dir / "checkpoint").glob("step-*"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "refexp-cache"  # conftest's session cache
    out = tmp_path_factory.mktemp("uninterrupted")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REFEXP_CACHE", str(cache))
        for name, overrides in RUNS.items():
            run(compose_resumable_run(out / name, *overrides, f"training.steps={N}"))
    return out


def test_uninterrupted_runs_move(uninterrupted):
    """The runs cross what a resume must carry: reference updates, beta, optimizer moments."""
    pr = metrics_by_step(uninterrupted / "grpo-periodic_reset", in_order=True)
    ema = metrics_by_step(uninterrupted / "grpo-ema", in_order=True)
    assert [pr[s]["ref/version"] for s in range(1, N + 1)] == [0, 1, 1, 2, 2, 3]
    assert [ema[s]["ref/version"] for s in range(1, N + 1)] == [1, 2, 3, 4, 5, 6]
    assert pr[N]["kl/beta"] != pr[1]["kl/beta"] and ema[N]["kl/beta"] != ema[1]["kl/beta"]
    assert ckpt_steps(uninterrupted / "grpo-ema") == [N - 1, N]  # keep_latest_k=2, the final save too


@pytest.mark.parametrize("name", list(RUNS))
def test_resume_equals_uninterrupted(tmp_path, uninterrupted, name):
    run(compose_resumable_run(tmp_path, *RUNS[name], f"training.steps={K}"))
    assert ckpt_steps(tmp_path) == [K - 1, K]
    run(compose_resumable_run(tmp_path, *RUNS[name], f"training.steps={N}"))
    assert_resumed_equal(tmp_path, uninterrupted / name, K + 1)
    assert ckpt_steps(tmp_path) == [N - 1, N]


def test_half_written_checkpoint_is_skipped(tmp_path, uninterrupted):
    """What a SIGKILL in the middle of saving step 5 leaves: ``step-5`` without ``.metadata`` (the
    data files of a real save are there), metrics logged for steps 4-5 and a torn last line."""
    name = "grpo-periodic_reset"
    run(compose_resumable_run(tmp_path, *RUNS[name], f"training.steps={K}"))
    ck = tmp_path / "checkpoint"
    shutil.copytree(ck / f"step-{K}", ck / "step-5")
    (ck / "step-5" / ".metadata").unlink()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 4, "loss/total": 123.0}) + "\n" + json.dumps({"step": 5, "loss/total": 1.0}) + "\n")
        f.write('{"step": 6, "loss/to')
    run(compose_resumable_run(tmp_path, *RUNS[name], f"training.steps={N}"))
    assert_resumed_equal(tmp_path, uninterrupted / name, K + 1)
    assert ckpt_steps(tmp_path) == [N - 1, N] and (ck / "step-5" / ".metadata").is_file()


# ---------------------------------------------------------------- real signals, real processes
def _start(run_dir: Path, steps: int) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="1")
    args = [sys.executable, "-m", "refexp", *SMALL_RUN_OVERRIDES, *CHECKPOINT_EVERY_STEP, *RUNS["grpo-ema"],
            f"training.steps={steps}", f"run_dir={run_dir}"]
    run_dir.mkdir(parents=True)
    with open(run_dir.with_suffix(".log"), "w") as log:
        return subprocess.Popen(args, env=env, cwd=CONF_DIR.parent, stdout=log, stderr=subprocess.STDOUT)


def _log_tail(run_dir: Path) -> str:
    return run_dir.with_suffix(".log").read_text()[-3000:]


def _logged_steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_metrics(run_dir)]


def _saving(run_dir: Path) -> bool:
    ck = run_dir / "checkpoint"
    return ck.is_dir() and any(not (p / ".metadata").exists() for p in ck.glob("step-*"))


def test_sigterm_saves_and_sigkill_resumes(tmp_path, uninterrupted):
    """Two subprocesses at once (start-up dominates): one gets SIGTERM after its first step, the other
    SIGKILL while a checkpoint is being written. Both then resume here to the uninterrupted numbers."""
    term_dir, kill_dir = tmp_path / "term", tmp_path / "kill"
    term = _start(term_dir, steps=100)
    kill = _start(kill_dir, steps=N)
    try:
        assert wait_for(lambda: 1 in _logged_steps(term_dir), term, 90, 0.01), _log_tail(term_dir)
        term.send_signal(signal.SIGTERM)
        # the second process: catch a save in flight (checkpoint.interval=1: one per step; a save's
        # files take milliseconds to write), at the latest once step 3 is logged
        caught = {"saving": False, "polls": 0}

        def ready() -> bool:
            caught["saving"] = _saving(kill_dir)
            caught["polls"] += 1
            return caught["saving"] or (caught["polls"] % 20 == 0 and 3 in _logged_steps(kill_dir))

        assert wait_for(ready, kill, 90, 0.001), _log_tail(kill_dir)
        kill.send_signal(signal.SIGKILL)
        term_rc, kill_rc = term.wait(60), kill.wait(60)
    finally:
        for p in (term, kill):
            if p.poll() is None:
                p.kill()

    # SIGTERM: the step in progress finished, was saved, and the run said so
    assert term_rc != 0, "a preempted run must not look completed"
    status = read_status(term_dir)
    stopped = max(_logged_steps(term_dir))
    assert status["status"] == "preempted" and status["last_step"] == stopped, status
    assert stopped < N and (term_dir / "checkpoint" / f"step-{stopped}" / ".metadata").is_file()
    assert max(_logged_steps(term_dir)) == stopped

    # SIGKILL: whatever it left (a half-written step folder if `caught`), the rerun resumes from the last good one
    assert kill_rc == -signal.SIGKILL
    for run_dir in (term_dir, kill_dir):  # the steps before the stop had the same config: compare all
        run(compose_resumable_run(run_dir, *RUNS["grpo-ema"], f"training.steps={N}"))
        assert_resumed_equal(run_dir, uninterrupted / "grpo-ema", 1)
    print(f"SIGTERM after step {stopped}; SIGKILL {'during a save' if caught['saving'] else 'between saves'}")
