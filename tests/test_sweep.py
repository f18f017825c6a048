"""A Hydra -m sweep: one failing job does not stop the others, the report lists it, the exit is non-zero."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from refexp.record.status import read_status
from tests.helpers.configs import TINY_GRPO_OVERRIDES, TINY_RUN_OVERRIDES


@pytest.mark.slow
def test_sweep_with_a_failing_job_still_reports(tmp_path):
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "refexp", "-m", *TINY_RUN_OVERRIDES, *TINY_GRPO_OVERRIDES, "training.steps=2",
           "algo.group_size=1,4",  # group_size=1 is invalid (advantages need a group): that job fails
           f"hydra.sweep.dir={sweep}", "+hydra.callbacks.report._target_=refexp.cli.sweep.ReportCallback"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=os.environ.copy())
    assert p.returncode != 0, p.stdout + p.stderr  # the sweep says that a job failed
    statuses = {d.name: read_status(d) for d in sweep.iterdir() if read_status(d) is not None}
    assert statuses["0"]["status"] == "failed" and "algo.group_size" in statuses["0"]["error"]
    assert statuses["1"]["status"] == "completed"
    report = (sweep / "report.md").read_text()
    assert "algo.group_size" in report and "failed" in report
    assert (sweep / "report.html").is_file()
    assert "report:" in p.stdout


@pytest.mark.slow
def test_plain_sweep_with_a_failing_job_exits_non_zero_after_the_others_ran(tmp_path):
    """No report callback (``refexp -m`` without an experiment): the exit status still says a job failed."""
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "refexp", "-m", *TINY_RUN_OVERRIDES, *TINY_GRPO_OVERRIDES, "training.steps=1",
           "task.reward=tests.helpers.rewards:no_such_reward,tests.helpers.rewards:by_length",
           f"hydra.sweep.dir={sweep}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    assert read_status(sweep / "0")["status"] == "failed" and "no_such_reward" in read_status(sweep / "0")["error"]
    assert read_status(sweep / "1")["status"] == "completed"  # the job after the failed one ran
    assert "1 job(s) of the sweep did not complete" in p.stderr and str(sweep / "0") in p.stderr


@pytest.mark.slow
def test_a_sweep_whose_jobs_are_all_refused_exits_non_zero(tmp_path):
    """Rerunning a completed sweep with another ``training.lr`` refuses every job (their run dirs hold runs of
    another configuration, and keep their ``completed`` status): the sweep still exits 1, naming them."""
    sweep = tmp_path / "sweep"
    for job in ("0", "1"):  # a completed job of lr 1e-3 (only the fields a rerun is compared on need be there)
        (sweep / job).mkdir(parents=True)
        (sweep / job / "resolved_config.yaml").write_text("training:\n  lr: 0.001\n")
        (sweep / job / "status.json").write_text('{"status": "completed", "last_step": 1, "final": {}}')
    cmd = [sys.executable, "-m", "refexp", "-m", *TINY_RUN_OVERRIDES, *TINY_GRPO_OVERRIDES, "training.steps=1",
           "training.lr=5e-4", "training.seed=0,1", f"hydra.sweep.dir={sweep}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    assert "2 job(s) of the sweep did not complete" in p.stderr, p.stderr[-2000:]
    assert "training.lr: 0.001 -> 0.0005" in p.stderr
    assert all(read_status(sweep / job)["status"] == "completed" for job in ("0", "1"))  # their records untouched
