"""One writer at a time: an exclusive lock file that names its owner (host, pid, start time, the pid's process
start from ``/proc``).

Used for a run dir (``refexp/run.py``: a second launch into a running run dir fails at once, naming the
owner) and for an SFT cache entry (``refexp/algos/sft.py``: a second job waits for the first's model).

Where the file system has ``fcntl.flock`` the lock is the kernel's: it is freed when its owner exits,
however it exits, so a lock file found unlocked is a dead owner's and is taken over (with a warning when
it still names that owner). On file systems without it (some network and FUSE mounts: ``flock`` fails
with ENOLCK, EOPNOTSUPP or ENOSYS) the lock is the file itself, created with ``O_CREAT|O_EXCL``; its
owner is alive while it is this host's and its pid runs the process that took the lock (``process_start``), or
another host's and its heartbeat (the file's modification time, touched every ``HEARTBEAT_S`` by a thread while
held) is newer than ``STALE_AFTER_S``. Taking over a stale lock there is best effort: two processes taking over the same
stale lock in the same instant may both succeed.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import threading
import time
import uuid
import warnings
from pathlib import Path
from typing import Optional

HEARTBEAT_S = 30.0
"""How often a holder without flock touches its lock file (and rank 0 writes status.json's heartbeat)."""
STALE_AFTER_S = 600.0
"""A heartbeat from another host older than this means its owner is gone (this host: the pid says)."""
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


class LockHeld(RuntimeError):
    """The lock is held by a live owner (``owner``: its host, pid and start time, {} when unreadable)."""

    def __init__(self, path: Path, owner: dict) -> None:
        self.path, self.owner = Path(path), owner
        super().__init__(f"{path} is held by {describe_owner(owner)}")


def held_by(path: str | os.PathLike) -> Optional[dict]:
    """The owner of the lock at ``path`` when a live one holds it, else None (a look: the lock is taken
    and given back at once when free; nothing is created when there is no lock file)."""
    if not Path(path).exists():
        return None
    try:
        FileLock(path).acquire().release()
    except LockHeld as e:
        return e.owner
    return None


def this_owner() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(),
            "pid_start": process_start(os.getpid())}


def describe_owner(owner: dict) -> str:
    """``host H, pid P (since 2024-05-01 12:00:03)``, or what is known of it."""
    if not owner.get("pid"):
        return "another process (its lock file names no owner yet)"
    since = owner.get("started")
    when = (f" (since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))})"
            if isinstance(since, (int, float)) else "")
    return f"host {owner.get('host', '?')}, pid {owner['pid']}{when}"


def process_start(pid) -> Optional[int]:
    """When this host's process ``pid`` started, in clock ticks since boot (``/proc/PID/stat`` field 22,
    proc(5)): with the pid it names one process, where the pid alone may have been given to another since.
    None where there is no ``/proc`` (macOS) or no such process."""
    try:
        text = Path(f"/proc/{int(pid)}/stat").read_text()
        # field 2, the command name, is in parentheses and may hold spaces: field 3 starts after the last ')'
        return int(text.rsplit(")", 1)[1].split()[22 - 3])
    except (OSError, ValueError, TypeError, IndexError):
        return None


def pid_alive(pid, started: Optional[int] = None) -> bool:
    """Whether process ``pid`` of this host exists and, when its start (``process_start``) was recorded as
    ``started``, is the same process (a pid given to another process since reads as gone). A value that is
    not a pid reads as gone."""
    try:
        pid = int(pid)
    except (TypeError, ValueError):
        return False
    if pid <= 0:  # os.kill(0 or -N, 0) asks after a process group, not a process
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    if isinstance(started, int) and not isinstance(started, bool):
        now = process_start(pid)
        return now is None or now == started
    return True


def owner_alive(owner: dict, heartbeat: float, *, now: Optional[float] = None) -> bool:
    """This host's owner: its pid runs, and is the process that started at ``owner["pid_start"]`` when that was
    recorded; another host's: its ``heartbeat`` (a time) is recent."""
    if owner.get("host") == socket.gethostname() and owner.get("pid"):
        return pid_alive(owner["pid"], owner.get("pid_start"))
    return (time.time() if now is None else now) - heartbeat < STALE_AFTER_S


def read_owner(path: Path) -> dict:
    """The owner a lock file names ({} when it is missing, empty or half-written)."""
    try:
        owner = json.loads(Path(path).read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


class FileLock:
    """``with FileLock(path): ...``: exclusive; ``blocking=False`` raises ``LockHeld`` when held by a live owner."""

    def __init__(self, path: str | os.PathLike, *, blocking: bool = False, poll_s: float = 1.0) -> None:
        self.path, self.blocking, self.poll_s = Path(path), blocking, poll_s
        self._fd: Optional[int] = None
        self._flock = True
        self._stop = threading.Event()

    def __enter__(self) -> "FileLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> "FileLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._flock = has_flock(self.path.parent)
        if not self._flock:
            return self._acquire_exclusive()
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                self._busy(read_owner(self.path))
                continue
            if _same_file(fd, self.path):  # else the holder we waited for unlinked it: lock the new file
                left = read_owner(self.path)
                if left.get("pid"):
                    warnings.warn(f"taking over the lock {self.path} of {describe_owner(left)}: that process is gone")
                return self._own(fd)
            os.close(fd)

    def _acquire_exclusive(self) -> "FileLock":
        """The lock without flock: whoever creates the file holds it."""
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                owner = read_owner(self.path)
                try:
                    heartbeat = self.path.stat().st_mtime
                except FileNotFoundError:
                    continue
                if owner_alive(owner, heartbeat):
                    self._busy(owner)
                    continue
                warnings.warn(f"taking over the stale lock {self.path} of {describe_owner(owner)}: "
                              f"that process is gone")
                _remove_if_owned_by(self.path, owner)
                continue
            self._stop.clear()
            threading.Thread(target=self._beat, daemon=True, name="refexp-lock-heartbeat").start()
            return self._own(fd)

    def _busy(self, owner: dict) -> None:
        if not self.blocking:
            raise LockHeld(self.path, owner)
        time.sleep(self.poll_s)

    def _own(self, fd: int) -> "FileLock":
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(this_owner()).encode())
        self._fd = fd
        return self

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.path)
            except OSError:
                pass  # a heartbeat missed; the next may succeed

    def release(self) -> None:
        if self._fd is None:
            return
        self._stop.set()
        try:
            if _same_file(self._fd, self.path):
                self.path.unlink()  # before unlocking: a waiter that locks the unlinked file retries (_same_file)
        finally:
            if self._flock:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def has_flock(directory: Path) -> bool:
    """Whether ``flock`` works on ``directory``'s file system (tried on a probe file there)."""
    probe = directory / f".flock-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as e:
        if e.errno not in _NO_FLOCK:
            raise
        return False
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _remove_if_owned_by(path: Path, owner: dict) -> None:
    """Remove a stale lock file unless it changed owner since it was read (another process took it over)."""
    aside = path.with_name(f"{path.name}.stale-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    if read_owner(aside) != owner:  # another process took it over in between: give it back
        os.rename(aside, path)
        return
    aside.unlink(missing_ok=True)
