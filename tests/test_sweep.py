"""A Hydra -m sweep: one failing job does not stop the others, the report lists it, the exit is non-zero."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.configs import TINY_GRPO_OVERRIDES, TINY_RUN_OVERRIDES


@pytest.mark.slow
def test_sweep_with_a_failing_job_still_reports(tmp_path):
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "refexp", "-m", *TINY_RUN_OVERRIDES, *TINY_GRPO_OVERRIDES, "training.steps=2",
           "algo.group_size=1,4",  # group_size=1 is invalid (advantages need a group): that job fails
           f"hydra.sweep.dir={sweep}", "+hydra.callbacks.report._target_=refexp.sweep.ReportCallback"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=os.environ.copy())
    assert p.returncode != 0, p.stdout + p.stderr  # the sweep says that a job failed
    statuses = {d.name: json.loads((d / "status.json").read_text()) for d in sweep.iterdir()
                if (d / "status.json").is_file()}
    assert statuses["0"]["status"] == "failed" and "algo.group_size" in statuses["0"]["error"]
    assert statuses["1"]["status"] == "completed"
    report = (sweep / "report.md").read_text()
    assert "algo.group_size" in report and "failed" in report
    assert (sweep / "report.html").is_file()
    assert "report:" in p.stdout
