"""``status.json``'s heartbeat is renewed through every phase of a run, not only at logged RL steps: a run in its
SFT stage or waiting on a cache entry's lock for longer than ``STALE_AFTER_S`` must not read as stale from another
host (refexp/record/status.py, ``Heartbeat``)."""

from __future__ import annotations

import time

import pytest

import refexp.algos.sft
import refexp.record.status as status_mod
from refexp.record.status import Heartbeat, RunStatus, open_status, read_status, write_status
from refexp.run import run
from tests.helpers.configs import compose_tiny_run


def test_the_heartbeat_thread_renews_a_running_status_and_stops_before_the_closing_one(tmp_path):
    open_status(tmp_path, RunStatus(steps=4))
    first = read_status(tmp_path)["heartbeat"]
    beating = Heartbeat(tmp_path, every_s=0.05).start()
    time.sleep(0.5)
    renewed = read_status(tmp_path)["heartbeat"]
    assert renewed["time"] > first["time"] and renewed["step"] == first["step"]
    beating.stop()
    write_status(tmp_path, {"status": "completed", "final": {}})
    closed = (tmp_path / "status.json").read_bytes()
    time.sleep(0.3)
    assert (tmp_path / "status.json").read_bytes() == closed  # no renewal over the closing status


@pytest.mark.slow
def test_a_run_renews_its_heartbeat_while_it_waits_for_its_start_model(tmp_path, monkeypatch):
    """``ensure_sft`` held up (as by another job's lock on the SFT cache entry): the heartbeat still moves."""
    monkeypatch.setattr(status_mod, "HEARTBEAT_S", 0.05)
    seen = []
    original = refexp.algos.sft.ensure_sft

    def slow_ensure_sft(ctx):
        seen.append(read_status(ctx.run_dir)["heartbeat"]["time"])
        time.sleep(0.6)
        seen.append(read_status(ctx.run_dir)["heartbeat"]["time"])
        return original(ctx)

    monkeypatch.setattr(refexp.algos.sft, "ensure_sft", slow_ensure_sft)
    run(compose_tiny_run(tmp_path, "algo=sft"))
    assert seen[1] > seen[0]
    assert read_status(tmp_path)["status"] == "completed"
