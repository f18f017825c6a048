"""Without flock, a held lock's file is its owner's heartbeat (``refexp/record/lock.py``): a thread touches it
every ``HEARTBEAT_S`` while it is held, so another host never reads a live owner as gone (600 s without a
touch), and it stops touching once released."""

from __future__ import annotations

import errno
import os
import time

from refexp.record import lock
from refexp.record.lock import FileLock, owner_alive, read_owner


def test_a_held_lock_without_flock_is_renewed_by_its_heartbeat_and_stays_alive_to_another_host(tmp_path, monkeypatch):
    def no_flock(*a, **k):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(lock.fcntl, "flock", no_flock)
    monkeypatch.setattr(lock, "HEARTBEAT_S", 0.05)
    path = tmp_path / "x.lock"
    with FileLock(path):
        os.utime(path, (1.0, 1.0))  # as if the last touch were long ago
        end = time.monotonic() + 10
        while path.stat().st_mtime < time.time() - 60 and time.monotonic() < end:
            time.sleep(0.02)
        assert path.stat().st_mtime > time.time() - 60, "the heartbeat thread never touched the lock file"
        elsewhere = {**read_owner(path), "host": "another-host"}  # how a process on another host judges it
        assert owner_alive(elsewhere, path.stat().st_mtime)
    assert not path.exists()
