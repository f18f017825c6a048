"""A run killed mid-training (SIGKILL, a lost node) leaves ``status.json`` ``running`` with no ``last_step``: the
step it reached is its heartbeat's. A rerun with fewer ``training.steps`` than that is refused before anything
is built or written (``refexp/components/rerun_checks.py``, ``check_rerun_steps``), as it is for a run that
recorded its end."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from refexp.config import ConfigError
from refexp.record import layout
from refexp.run import run
from tests.helpers.configs import TINY_GRPO_OVERRIDES, compose_tiny_run


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _killed_run(run_dir, step):
    """A status.json left by a run killed at heartbeat step ``step`` (``running``, its pid gone): its path."""
    killed = {"status": "running", "algo": "grpo", "steps": 60, "last_step": None,
              "heartbeat": {"host": socket.gethostname(), "pid": _dead_pid(), "time": time.time() - 5, "step": step}}
    status = layout.path(run_dir, layout.STATUS)
    status.write_text(json.dumps(killed))
    return status


def test_a_killed_runs_heartbeat_step_refuses_a_rerun_with_fewer_steps(tmp_path):
    status = _killed_run(tmp_path, 40)
    before = status.read_bytes()
    with pytest.raises(ConfigError, match=r"reached 40 steps.*training\.steps=10 is fewer"):
        run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, "training.steps=10"))
    assert status.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [layout.STATUS]  # nothing else written


@pytest.mark.parametrize("step", ["forty", "4x", -3, [40]])
def test_a_heartbeat_step_that_is_not_a_step_count_is_refused_in_one_line_naming_the_file(tmp_path, step):
    status = _killed_run(tmp_path, step)
    before = status.read_bytes()
    with pytest.raises(ConfigError, match=r"status\.json: heartbeat\.step is .*not a step count"):
        run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, "training.steps=10"))
    assert status.read_bytes() == before
