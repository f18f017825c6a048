"""``status.json`` tells the truth and a finished run keeps its record: a rerun with fewer steps is refused
before anything is written, a rerun that does not advance a completed run leaves its status byte-identical,
a full disk at the checkpoint save and at the status write still reports the save's error and ends the
status, stop signals raise in every phase, and a ``running`` run whose process is gone is ``stale``."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from refexp.config import ConfigError
from refexp.record import status as rstatus
from refexp.record.status import RunStatus, close_run_status, open_status, read_status, stale_reason
from refexp.report.reading.load import load_run
from refexp.run import run
from refexp.runtime.stop_signals import Preempted, installed
from tests.helpers.configs import TINY_GRPO_OVERRIDES, TINY_RUN_OVERRIDES, compose_tiny_run


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# ---------------------------------------------------------------- heartbeat and stale
def test_running_status_of_a_gone_process_is_stale_in_the_report(tmp_path):
    open_status(tmp_path, RunStatus(algo="grpo", steps=10))
    st = read_status(tmp_path)
    assert st["status"] == "running" and st["heartbeat"]["pid"] == os.getpid()
    assert stale_reason(st) is None and load_run(tmp_path, tmp_path).state == "running"  # alive: this process

    st["heartbeat"]["pid"] = _dead_pid()
    (tmp_path / "status.json").write_text(json.dumps(st))
    run_ = load_run(tmp_path, tmp_path)
    assert run_.state == "stale" and f"pid {st['heartbeat']['pid']}" in run_.problem

    other = {**st, "heartbeat": {**st["heartbeat"], "host": "elsewhere", "time": time.time()}}
    assert stale_reason(other) is None  # another host: a recent heartbeat is alive
    assert "stale" in stale_reason(other, now=time.time() + 3600)


def test_a_killed_runs_pid_given_to_another_process_reads_stale(tmp_path):
    """kill -9, then the pid reused: the heartbeat's process start (/proc/PID/stat field 22) tells them apart."""
    from refexp.record.lock import process_start

    open_status(tmp_path, RunStatus(algo="grpo", steps=10))
    st = read_status(tmp_path)
    assert st["heartbeat"]["pid_start"] == process_start(os.getpid()) is not None
    reused = {**st, "heartbeat": {**st["heartbeat"], "pid_start": st["heartbeat"]["pid_start"] - 1}}
    (tmp_path / "status.json").write_text(json.dumps(reused))  # this live pid, another process's start
    run_ = load_run(tmp_path, tmp_path)
    assert run_.state == "stale" and f"pid {os.getpid()}" in run_.problem
    unrecorded = {**st, "heartbeat": {k: v for k, v in st["heartbeat"].items() if k != "pid_start"}}
    assert stale_reason(unrecorded) is None  # written before starts were recorded: the pid alone decides


@pytest.mark.parametrize("pid", ["abc", "12x", -1, [1]])
def test_a_heartbeat_whose_pid_is_not_a_pid_reads_stale_in_the_report(tmp_path, pid):
    open_status(tmp_path, RunStatus(algo="grpo", steps=10))
    st = read_status(tmp_path)
    (tmp_path / "status.json").write_text(json.dumps({**st, "heartbeat": {**st["heartbeat"], "pid": pid}}))
    run_ = load_run(tmp_path, tmp_path)
    assert run_.state == "stale" and run_.problem.startswith("stale: its process") and "\n" not in run_.problem


def test_beat_renews_only_a_running_status_this_process_wrote(tmp_path):
    open_status(tmp_path, RunStatus(steps=10))
    first = read_status(tmp_path)["heartbeat"]
    rstatus.beat(tmp_path, 3, every_s=0)
    hb = read_status(tmp_path)["heartbeat"]
    assert hb["step"] == 3 and hb["time"] >= first["time"]
    rstatus.write_status(tmp_path, {**read_status(tmp_path), "status": "failed"})
    before = (tmp_path / "status.json").read_bytes()
    rstatus.beat(tmp_path, 4, every_s=0)  # another rank's failure is never overwritten by a heartbeat
    assert (tmp_path / "status.json").read_bytes() == before


def test_the_heartbeat_records_the_loops_step_when_the_thread_renews_first(tmp_path):
    """The Heartbeat thread renews every HEARTBEAT_S, so the loop's own beat (throttled to once per HEARTBEAT_S)
    is skipped after each of the thread's renewals: the thread's next renewal must still carry the loop's step."""
    open_status(tmp_path, RunStatus(steps=150))
    rstatus.beat(tmp_path, None, every_s=0)  # the thread
    rstatus.beat(tmp_path, 125, every_s=3600)  # the loop, a moment later: throttled
    assert read_status(tmp_path)["heartbeat"]["step"] == 0
    rstatus.beat(tmp_path, None, every_s=0)  # the thread's next renewal
    assert read_status(tmp_path)["heartbeat"]["step"] == 125
    open_status(tmp_path, RunStatus(steps=150))  # a rerun in the same process starts from its own step
    rstatus.beat(tmp_path, None, every_s=0)
    assert read_status(tmp_path)["heartbeat"]["step"] == 0


def test_a_rank_failure_written_while_a_heartbeat_renews_is_not_written_over(tmp_path, monkeypatch):
    """Rank k's failure lands between the heartbeat's read of ``running`` and its write: the status lock makes
    the failure wait for the heartbeat's write, and the heartbeat never writes ``running`` over ``failed``.

    The heartbeat goes on only once rank 1's write has settled: rank 1 is blocked on the status lock (its
    non-blocking try is refused), or it has written. No wait decides it: without the lock rank 1 always writes
    first and the heartbeat writes over it."""
    import threading

    open_status(tmp_path, RunStatus(steps=10))
    real_read, real_flock = rstatus.read_status, rstatus.fcntl.flock
    failure: list[threading.Thread] = []
    blocked, settled = threading.Event(), threading.Event()

    def flock(fd, op):  # rank 1's thread: say when the lock it asks for is held by the heartbeat
        if failure and threading.current_thread() is failure[0] and op == rstatus.fcntl.LOCK_EX:
            try:
                return real_flock(fd, op | rstatus.fcntl.LOCK_NB)
            except BlockingIOError:
                blocked.set()
                settled.set()
        return real_flock(fd, op)

    def rank_1_fails():
        try:
            rstatus.record_rank_failure(tmp_path, 1, {"error": "injected failure on rank 1"})
        finally:
            settled.set()

    def read_then_let_rank_1_fail(run_dir):
        current = real_read(run_dir)
        if threading.current_thread() is threading.main_thread() and not failure:
            failure.append(threading.Thread(target=rank_1_fails))
            failure[0].start()
            assert settled.wait(timeout=60), "rank 1 neither blocked on the status lock nor wrote its failure"
        return current

    monkeypatch.setattr(rstatus.fcntl, "flock", flock)
    monkeypatch.setattr(rstatus, "read_status", read_then_let_rank_1_fail)
    rstatus.beat(tmp_path, 3, every_s=0)
    failure[0].join()
    st = real_read(tmp_path)
    assert st["status"] == "failed" and st["failed_rank"] == 1 and st["heartbeat"]["step"] == 3, st
    assert blocked.is_set(), "rank 1 never waited for the heartbeat's status lock"


# ---------------------------------------------------------------- a full disk
def _disk_full_after_start(monkeypatch):
    """Every write of a new status.json fails with ENOSPC, except the padded one at the start."""
    original = rstatus.write_text_atomic

    def write(path, text, **kw):
        if path.name == "status.json" and not text.endswith(" "):  # padded: ends in spaces
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return original(path, text, **kw)

    monkeypatch.setattr(rstatus, "write_text_atomic", write)


def test_status_write_on_a_full_disk_goes_into_the_reserved_bytes(tmp_path, monkeypatch):
    st = RunStatus(steps=10)
    earlier = open_status(tmp_path, st)
    _disk_full_after_start(monkeypatch)
    try:
        raise OSError(errno.ENOSPC, "No space left on device", "checkpoint/step-3")
    except OSError as e:
        st.stopped(e, preempted=False, last_step=3, traceback="x" * rstatus.RESERVED_BYTES)  # too long to fit
    close_run_status(tmp_path, st, earlier, rank=0)
    got = read_status(tmp_path)
    assert got["status"] == "failed" and "checkpoint/step-3" in got["error"] and "traceback" not in got


def test_full_disk_at_a_save_reports_the_save_and_ends_the_status(tmp_path, dense_reward, monkeypatch, capsys):
    import refexp.components.checkpoint

    def full(self, step, **kw):
        raise OSError(errno.ENOSPC, "No space left on device", f"checkpoint/step-{step}")

    monkeypatch.setattr(refexp.components.checkpoint.Checkpointer, "save", full)
    _disk_full_after_start(monkeypatch)
    with pytest.raises(OSError, match=r"checkpoint/step-1"):  # the save's error, not the status write's
        run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, "checkpoint.interval=1"))
    got = read_status(tmp_path)
    assert got["status"] == "failed" and "checkpoint/step-1" in got["error"], got


TORCH_FULL = ("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file data/0: "
              "file write failed")
"""What torch.save says on a full disk: no errno, no "No space left on device"."""


def test_a_full_disk_is_named_as_the_cause_whatever_error_it_shows_up_as(tmp_path, monkeypatch):
    from refexp.record import disk_full
    from refexp.record.disk_full import describe_error

    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "metrics.jsonl")
        except OSError as e:
            raise RuntimeError("writing the metrics failed") from e
    except RuntimeError as e:
        wrapped = e
    assert describe_error(wrapped).startswith("No space left on device: RuntimeError: writing the metrics failed")
    torch_error = RuntimeError(TORCH_FULL)
    assert describe_error(torch_error, tmp_path) == f"RuntimeError: {TORCH_FULL}"  # room left: another failure
    monkeypatch.setattr(disk_full, "free_bytes", lambda where: 0)
    assert describe_error(torch_error, tmp_path) == (f"No space left on device (the file system of {tmp_path} is "
                                                     f"full): RuntimeError: {TORCH_FULL}")
    assert describe_error(ValueError("x"), tmp_path) == "ValueError: x"


_FULL_AT_SAVE = ("import sys, refexp.components.checkpoint as c, refexp.record.disk_full as d\n"
                 "def save(self, step, **kw):\n"
                 f"    raise RuntimeError({TORCH_FULL!r})\n"
                 "c.Checkpointer.save = save\n"
                 "d.free_bytes = lambda where: 0\n"
                 "from refexp.__main__ import main\n"
                 "sys.argv = ['refexp', *sys.argv[1:]]\n"
                 "main()\n")


@pytest.mark.slow
def test_a_full_disk_at_a_checkpoint_save_is_one_line_and_the_status_names_it(tmp_path):
    out = subprocess.run([sys.executable, "-c", _FULL_AT_SAVE, *TINY_RUN_OVERRIDES, *TINY_GRPO_OVERRIDES,
                          "checkpoint.interval=1", f"hydra.run.dir={tmp_path}"],
                         capture_output=True, text=True, timeout=300)
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("refexp: error:") or "Traceback" in ln]
    assert out.returncode == 1 and lines == [lines[0]], out.stderr[-3000:]
    assert lines[0].startswith(f"refexp: error: No space left on device (the file system of {tmp_path} is full): "
                               f"RuntimeError: [enforce fail"), lines[0]
    got = read_status(tmp_path)
    assert got["status"] == "failed" and got["error"].startswith("No space left on device"), got["error"]


# ---------------------------------------------------------------- reruns of a finished run
def test_rerun_with_fewer_steps_is_refused_and_a_failed_rerun_changes_nothing(tmp_path, dense_reward, monkeypatch):
    run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, "training.steps=4"))
    before = (tmp_path / "status.json").read_bytes()
    metrics = (tmp_path / "metrics.jsonl").read_bytes()
    import refexp.components.models

    def no_build(*a, **k):
        raise AssertionError("a model was built for a refused rerun")

    with monkeypatch.context() as mp:
        mp.setattr(refexp.components.models, "build_run_model", no_build)
        with pytest.raises(ConfigError, match=r"completed 4 steps.*training\.steps=2 is fewer.*training\.steps >= 4"):
            run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, "training.steps=2"))
    assert (tmp_path / "status.json").read_bytes() == before

    # a rerun with the same steps that fails (here: at the start of the algorithm) did not advance the run
    import refexp.algos.sft

    def broken(ctx):
        raise RuntimeError("broken rerun")

    monkeypatch.setattr(refexp.algos.sft, "ensure_sft", broken)
    with pytest.raises(RuntimeError, match="broken rerun"):
        run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, "training.steps=4"))
    assert (tmp_path / "status.json").read_bytes() == before
    assert (tmp_path / "metrics.jsonl").read_bytes() == metrics


# ---------------------------------------------------------------- stop signals in-process
@pytest.mark.parametrize("signum, error", [(signal.SIGTERM, Preempted), (signal.SIGUSR2, Preempted),
                                           (signal.SIGINT, KeyboardInterrupt)])
def test_stop_signals_raise_within_the_block_and_handlers_come_back(signum, error, sigint_deliverable):
    before = signal.getsignal(signum)
    with pytest.raises(error, match=signal.Signals(signum).name):
        with installed():
            os.kill(os.getpid(), signum)
            time.sleep(1)
    assert signal.getsignal(signum) is before


def test_a_handler_found_is_called_first():
    called = []
    previous = signal.signal(signal.SIGUSR2, lambda s, f: called.append(s))
    try:
        with pytest.raises(Preempted), installed():
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(1)
        assert called == [signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_status_heartbeat_names_this_host():
    assert rstatus.new_heartbeat(5)["host"] == socket.gethostname()


def test_status_names_the_sft_start_and_the_report_setup_block_shows_it(tmp_path):
    """``status.json`` records which SFT cache entry the run started from (its key, never a machine path) and the
    validation accuracy the SFT stage measured; the report's setup block reads it from there."""
    from refexp.report.reading.setup import sft_start

    cfg = compose_tiny_run(tmp_path / "run", *TINY_GRPO_OVERRIDES, "training.steps=1")
    run(cfg)
    start = read_status(tmp_path / "run")["sft_start"]
    sft_root = Path(os.path.expanduser(cfg.sft.cache_dir)) / "sft"
    entry = sft_root / start["key"]
    summary = json.loads((entry / "sft.json").read_text())
    assert os.sep not in start["key"] and start["val_accuracy"] == summary["val_accuracy"]
    shown = sft_start([load_run(tmp_path / "run", tmp_path)])
    assert start["key"] in shown and f"{summary['val_accuracy']:.3f}" in shown and str(sft_root) not in shown


def test_a_resumed_run_keeps_when_its_first_invocation_started(tmp_path):
    """``started`` is each invocation's; ``first_started`` survives a resume, so the report can tell whether an
    experiment file was committed before the run began (refexp/report/reading/config_history.py)."""
    first = RunStatus(steps=10, started=1000.0)
    earlier = open_status(tmp_path, first)
    close_run_status(tmp_path, first, earlier, rank=0)
    again = RunStatus(steps=10, started=2000.0)
    open_status(tmp_path, again)
    got = read_status(tmp_path)
    assert got["started"] == 2000.0 and got["first_started"] == 1000.0
