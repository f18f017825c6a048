"""One writer per run dir (``refexp/record/lock.py``): a second launch into a running run dir fails at once
naming the owner, and the first run's record stays whole; a lock left by a dead process is taken over, with
flock and without it (O_EXCL + pid/heartbeat); run dirs that cannot be made fail in one line."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from refexp.record import layout, lock
from refexp.record.lock import FileLock, LockHeld
from refexp.record.metrics import read_metrics
from refexp.record.samples import read_samples
from refexp.record.status import read_status
from tests.helpers.configs import TINY_GRPO_OVERRIDES, TINY_RUN_OVERRIDES
from tests.helpers.processes import wait_for

ROOT = Path(__file__).resolve().parents[1]


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _without_flock(monkeypatch) -> None:
    """A file system without flock: it fails with ENOLCK (some NFS and FUSE mounts)."""
    def no_flock(*a, **k):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(lock.fcntl, "flock", no_flock)


@pytest.fixture(params=["flock", "no-flock"])
def flock_mode(request, monkeypatch):
    """The lock with the kernel's flock, and without it."""
    if request.param == "no-flock":
        _without_flock(monkeypatch)
    return request.param


def test_second_holder_is_refused_with_the_owner(tmp_path, flock_mode):
    path = tmp_path / "x.lock"
    first = FileLock(path).acquire()
    with pytest.raises(LockHeld) as e:
        FileLock(path).acquire()
    assert e.value.owner["pid"] == os.getpid() and e.value.owner["host"] == socket.gethostname()
    assert f"pid {os.getpid()}" in str(e.value)
    first.release()
    assert not path.exists()
    FileLock(path).acquire().release()  # free again


def test_lock_of_a_dead_process_is_taken_over(tmp_path, flock_mode):
    path = tmp_path / "x.lock"
    dead = {"host": socket.gethostname(), "pid": _dead_pid(), "started": time.time()}
    path.write_text(json.dumps(dead))
    with pytest.warns(UserWarning, match=f"pid {dead['pid']}.*gone"):
        held = FileLock(path).acquire()
    assert lock.read_owner(path)["pid"] == os.getpid()
    held.release()


def test_without_flock_a_live_owner_holds_and_an_old_heartbeat_of_another_host_does_not(tmp_path, monkeypatch):
    _without_flock(monkeypatch)
    path = tmp_path / "x.lock"
    path.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getppid(), "started": 0}))
    with pytest.raises(LockHeld):
        FileLock(path).acquire()
    path.write_text(json.dumps({"host": "elsewhere", "pid": 1, "started": 0}))  # heartbeat: mtime, now
    with pytest.raises(LockHeld, match="host elsewhere, pid 1"):
        FileLock(path).acquire()
    old = time.time() - lock.STALE_AFTER_S - 1
    os.utime(path, (old, old))
    with pytest.warns(UserWarning, match="host elsewhere"):
        FileLock(path).acquire().release()


def test_held_by_looks_without_taking(tmp_path):
    path = tmp_path / "x.lock"
    assert lock.held_by(path) is None and not path.exists()  # no lock file: nothing created
    with FileLock(path):
        assert lock.held_by(path)["pid"] == os.getpid()
    assert lock.held_by(path) is None


@pytest.mark.parametrize("run_dir", ["/proc/refexp-no/run", "/etc/passwd"])
def test_run_dir_that_cannot_be_made_is_one_line(run_dir):
    p = subprocess.run([sys.executable, "-m", "refexp", f"run_dir={run_dir}", *TINY_RUN_OVERRIDES,
                        *TINY_GRPO_OVERRIDES],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 2, p.stderr[-2000:]
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and run_dir in p.stderr
    assert p.stderr.startswith("refexp: error: cannot use the run dir")


def test_hydra_run_dir_that_cannot_be_made_is_one_line():
    p = subprocess.run([sys.executable, "-m", "refexp", "hydra.run.dir=/proc/refexp-no", "dry_run=true"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 2 and p.stderr.startswith("refexp: error: cannot use the run dir /proc/refexp-no"), p.stderr


@pytest.mark.slow
def test_second_launch_into_a_running_run_dir_fails_at_once(tmp_path):
    """A real run writes its run dir; a second launch into it fails in one line naming the first's pid,
    writes nothing there, and the first completes with every step logged once."""
    run_dir, steps = tmp_path / "run", 400
    args = [sys.executable, "-m", "refexp", *TINY_RUN_OVERRIDES, *TINY_GRPO_OVERRIDES, f"training.steps={steps}",
            "eval.every=200", f"run_dir={run_dir}"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    log = open(tmp_path / "first.log", "w")
    first = subprocess.Popen(args, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        assert wait_for(lambda: any(r["step"] == 1 for r in read_metrics(run_dir)), first, 180, 0.01), \
            (tmp_path / "first.log").read_text()[-3000:]
        second = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert first.poll() is None, "the first run ended before the second launch was refused: make it longer"
        assert second.returncode == 2, second.stderr[-3000:]
        assert second.stderr.strip() == second.stderr.strip().splitlines()[0]
        assert f"pid {first.pid}" in second.stderr and str(run_dir) in second.stderr
        assert "being written" in second.stderr
        assert first.wait(300) == 0, (tmp_path / "first.log").read_text()[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
        log.close()
    assert not (run_dir / layout.LOCK).exists()  # released at the end
    status = read_status(run_dir)
    assert status["status"] == "completed" and status["last_step"] == steps and "heartbeat" not in status
    assert [r["step"] for r in read_metrics(run_dir)] == list(range(steps + 1))  # each step once, none lost
    samples = read_samples(run_dir, "eval")  # each evaluation's samples once (two writers: twice)
    assert sorted({r["step"] for r in samples}) == [0, 200, 400]
    assert len(samples) == len({(r["step"], r["prompt"]) for r in samples})


@pytest.mark.slow
def test_a_launch_refused_by_the_lock_leaves_the_owners_hydra_record(tmp_path):
    """Hydra's ``.hydra/`` is written once a job holds its run dir's lock (refexp/record/hydra_record.py): a launch
    refused by the lock, past the command-line check (as when two start in the same instant), leaves the owner's
    overrides, which the report reads the arm from."""
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    owners = "- training.seed=0\n"
    (run_dir / ".hydra" / "overrides.yaml").write_text(owners)
    app = "import sys; from refexp.__main__ import _app; sys.argv[0] = 'refexp'; _app()"  # no precheck
    with FileLock(run_dir / layout.LOCK):  # the owner
        p = subprocess.run([sys.executable, "-c", app, *TINY_RUN_OVERRIDES, "training.seed=1",
                            f"hydra.run.dir={run_dir}"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 2 and "being written by" in p.stderr, p.stderr[-2000:]
    assert (run_dir / ".hydra" / "overrides.yaml").read_text() == owners
