"""A rerun of a completed run that is interrupted before it passes that run's end leaves the run's record
byte for byte as it was (refexp/record/rerun.py): SIGINT after resuming from an earlier checkpoint, SIGTERM after
restarting without checkpoints, SIGKILL in a subprocess. One that passes the end continues the run."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import refexp.algos.loop
from refexp.record import layout
from refexp.record.jsonl import read_rows
from refexp.record.metrics import read_metrics
from refexp.record.status import read_status
from refexp.run import run
from tests.helpers.configs import TINY_GRPO_OVERRIDES, TINY_RUN_OVERRIDES, compose_tiny_run
from tests.helpers.processes import wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
RECORD = (layout.METRICS, layout.SAMPLES, layout.EVAL_OUTCOMES, layout.STATUS)
EVERY_STEP = ["training.steps=4", "checkpoint.interval=1", "checkpoint.keep_latest_k=0", "eval.log_samples=2"]


def record(run_dir: Path) -> dict[str, bytes]:
    return {name: (run_dir / name).read_bytes() for name in RECORD}


def _signal_at(monkeypatch, step: int, signum: int) -> None:
    """Send ``signum`` to this process right after step ``step`` is logged (the loop's heartbeat call)."""
    real = refexp.algos.loop.beat

    def beat(run_dir, at, **kw):
        real(run_dir, at, **kw)
        if at == step:
            os.kill(os.getpid(), signum)

    monkeypatch.setattr(refexp.algos.loop, "beat", beat)


@pytest.fixture
def completed(tmp_path) -> Path:
    run_dir = tmp_path / "run"
    run(compose_tiny_run(run_dir, *TINY_GRPO_OVERRIDES, *EVERY_STEP))
    assert read_status(run_dir)["status"] == "completed"
    assert all((run_dir / name).stat().st_size > 0 for name in RECORD)
    return run_dir


def test_interrupted_reruns_leave_a_completed_run_as_it_was(completed, monkeypatch, sigint_deliverable):
    before = record(completed)
    with monkeypatch.context() as mp:  # SIGINT at step 3 of a rerun resumed from step 2
        _signal_at(mp, 3, signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            run(compose_tiny_run(completed, *TINY_GRPO_OVERRIDES, *EVERY_STEP, "checkpoint.load_step=2"))
    assert record(completed) == before
    assert not (completed / layout.RERUN_DIR).exists()

    shutil.rmtree(completed / "checkpoint")  # SIGTERM at step 2 of a rerun that starts again from step 0
    with monkeypatch.context() as mp:
        _signal_at(mp, 2, signal.SIGTERM)
        with pytest.raises(SystemExit, match="saved step 2"):
            run(compose_tiny_run(completed, *TINY_GRPO_OVERRIDES, *EVERY_STEP))
    assert record(completed) == before

    # a rerun to the end does not pass it either: the record stays, the checkpoints are written again
    final = run(compose_tiny_run(completed, *TINY_GRPO_OVERRIDES, *EVERY_STEP))
    assert final["step"] == 4 and record(completed) == before
    assert (completed / "checkpoint" / "step-4").is_dir()

    # one that passes the end continues the run: its record grows, its status is completed at the new end
    run(compose_tiny_run(completed, *TINY_GRPO_OVERRIDES, *EVERY_STEP[1:], "training.steps=5"))
    assert [r["step"] for r in read_metrics(completed)] == [0, 1, 2, 3, 4, 5]
    assert (completed / layout.METRICS).read_bytes().startswith(before[layout.METRICS])
    status = read_status(completed)
    assert status["status"] == "completed" and status["last_step"] == 5
    assert not (completed / layout.RERUN_DIR).exists()


def test_a_rerun_killed_before_it_passes_the_end_leaves_the_record(completed, tmp_path):
    before = record(completed)
    shutil.rmtree(completed / "checkpoint")
    with open(tmp_path / "rerun.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "refexp", *TINY_RUN_OVERRIDES, *TINY_GRPO_OVERRIDES,
                                 *EVERY_STEP, f"run_dir={completed}"],
                                env=dict(os.environ, OMP_NUM_THREADS="1"), cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        copy = completed / layout.RERUN_DIR

        def logged_step_1() -> bool:  # the copy of the record was truncated, then steps 0 and 1 logged again
            return (copy / layout.STATUS).exists() and 2 <= len(read_rows(copy / layout.METRICS)) <= 3

        assert wait_for(logged_step_1, proc, timeout=180, poll=0.01), \
            (tmp_path / "rerun.log").read_text()[-3000:]
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert record(completed) == before


def _rerun(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    """``refexp ... hydra.run.dir=RUN_DIR`` as a user reruns a sweep's job by hand (Hydra's record goes there)."""
    proc = subprocess.run([sys.executable, "-m", "refexp", *TINY_RUN_OVERRIDES, *TINY_GRPO_OVERRIDES, *overrides,
                           f"hydra.run.dir={run_dir}"], env=dict(os.environ, OMP_NUM_THREADS="1"), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_a_rerun_that_measures_nothing_leaves_the_jobs_hydra_record(completed):
    """The sweep's job recorded ``training.lr=0.001`` (its sweeper's spelling); the same job rerun by hand says
    ``training.lr=1e-3`` (TINY_GRPO_OVERRIDES). Resumed at the end, the rerun measures nothing and leaves ``.hydra/``
    byte for byte (else the report splits the arm in two); one past the end records its own command."""
    hydra = completed / layout.HYDRA_DIR
    hydra.mkdir()
    (hydra / "overrides.yaml").write_text(yaml.safe_dump([*(o.replace("1e-3", "0.001") for o in TINY_GRPO_OVERRIDES),
                                                          *EVERY_STEP]))
    (hydra / "config.yaml").write_text("training:\n  lr: 0.001\n")
    (hydra / "hydra.yaml").write_text("hydra:\n  mode: MULTIRUN\n")
    before, jobs = record(completed), {p.name: p.read_bytes() for p in hydra.iterdir()}

    proc = _rerun(completed, *EVERY_STEP)
    assert "record is unchanged" in proc.stderr, proc.stderr[-3000:]
    assert {p.name: p.read_bytes() for p in hydra.iterdir()} == jobs and record(completed) == before
    assert not (completed / layout.RERUN_DIR).exists()

    _rerun(completed, *EVERY_STEP[1:], "training.steps=5")
    assert read_status(completed)["last_step"] == 5
    assert "training.steps=5" in yaml.safe_load((hydra / "overrides.yaml").read_text())
    assert yaml.safe_load((hydra / "hydra.yaml").read_text())["hydra"]["mode"] == "RUN"
    assert not (completed / layout.RERUN_DIR).exists()
