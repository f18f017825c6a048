"""``status.json``: what became of a run (running / completed / failed / preempted, with the error).

Rank 0 writes it at the start and at the end (``RunStatus``, ``open_status``, ``close_run_status``). A
failure on another rank must reach it too, and first: the launcher (torchrun, ``refexp/runtime/launcher.py``) stops
the surviving ranks when one process fails, and rank 0 may be killed inside a collective before it writes
anything, or fail itself with nothing more telling than gloo's "Connection closed by peer". So a failing
rank k > 0 writes its own error into ``status.json`` before its process exits (``record_rank_failure``), and
rank 0's closing write keeps that error as the run's (``close_status``). The first failure recorded wins:
it is the root cause, the later ones follow from it. Readers take the file as a dict: it may come from an
older version of refexp (``wall_seconds`` and ``provenances`` read those too).

A ``running`` status carries a heartbeat (host, pid, time, step; ``beat`` renews it at most every
``HEARTBEAT_S``, at the training loop's logged steps and from a ``Heartbeat`` thread through every phase: the SFT
and reward-model stages, a wait on a cache entry's lock), so a reader tells a live run from one whose process is
gone (``stale_reason``). While
running, the file is padded to ``RESERVED_BYTES``: a closing write that a full disk refuses goes over those
bytes in place (``write_status``). A run that did not advance a completed run leaves its status as it was
(``close_run_status``). What the values mean: docs/runs.md.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from refexp.record import layout
from refexp.record.atomic import json_default, write_text_atomic
from refexp.record.disk_full import describe_error
from refexp.record.lock import HEARTBEAT_S, describe_owner, owner_alive, process_start

ENDED = ("failed", "preempted")
_SET_AT_THE_END = ("traceback", "ended", "wall_s", "provenances", "heartbeat", "sft_start")
"""``RunStatus`` fields written only once they have a value."""
RESERVED_BYTES = 16384
"""The size of a ``running`` status.json: room for the closing status (a traceback of 20 frames) on a full disk."""


@dataclass(kw_only=True)
class RunStatus:
    """This invocation's status, as the trainer fills it (``to_json`` is what ``status.json`` holds)."""

    status: str = "running"
    """running | completed | failed | preempted."""
    error: Optional[str] = None
    algo: Optional[str] = None
    reference: Optional[str] = None
    seed: Optional[int] = None
    steps: Optional[int] = None
    """``training.steps``: the steps planned."""
    last_step: int = 0
    final: dict = field(default_factory=dict)
    """The final metrics (numbers only) of a completed run."""
    started: float = field(default_factory=time.time)
    """When this invocation started."""
    first_started: Optional[float] = None
    """When the run dir's first invocation started (``open_status`` carries it over a resume): the time a
    pre-registered config must predate (``refexp/report/reading/config_history.py``)."""
    provenance: Optional[dict] = None
    """The code that ran this invocation (``refexp/record/provenance.py``)."""
    traceback: Optional[str] = None
    ended: Optional[float] = None
    wall_s: Optional[float] = None
    """Seconds run by every invocation of this run dir so far (``wall_seconds``)."""
    provenances: Optional[list] = None
    """The code versions that advanced the run, in order (``with_provenance``)."""
    heartbeat: Optional[dict] = None
    """While running: ``{host, pid, time, step}`` of rank 0's process, renewed by ``beat``."""
    cpus: Optional[dict] = None
    """Rank 0's ``{threads, affinity}``: torch's intra-op threads and the CPU cores its process may run on
    (one core under ``hydra/launcher=cpu_cores``)."""
    sft_start: Optional[dict] = None
    """The model the run started from: ``{key, val_accuracy, eval_accuracy}``, ``key`` the SFT cache entry's name
    (or the start directory's name, never a machine path); the accuracies when the SFT stage measured them."""

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None or k not in _SET_AT_THE_END}

    def stopped(self, error: BaseException, *, preempted: bool, last_step: int, traceback: str,
                where: str | Path | None = None) -> None:
        """The run ended with ``error`` (``preempted``: by a stop signal, after saving a checkpoint); a full disk
        under ``where`` (the run dir) is named as its cause (``record.disk_full``)."""
        self.status = "preempted" if preempted else "failed"
        self.error, self.traceback, self.last_step = describe_error(error, where), traceback, last_step


def read_status_file(run_dir: str | Path) -> tuple[Optional[dict], Optional[str]]:
    """``(status, problem)``: the run dir's status and None, or None and why it cannot be used (None as well
    when the run dir has no status.json)."""
    p = layout.path(run_dir, layout.STATUS)
    if not p.exists():
        return None, None
    try:
        status = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        return None, f"unreadable status.json ({e.__class__.__name__})"
    if not isinstance(status, dict):
        return None, "status.json is not a JSON object"
    return status, None


def read_status(run_dir: str | Path) -> Optional[dict]:
    """The run dir's status, or None when it has none (or a half-written or broken one)."""
    return read_status_file(run_dir)[0]


@contextmanager
def status_update(run_dir: str | Path) -> Iterator[None]:
    """Hold the run dir's status lock for one read-modify-write of ``status.json``: rank 0's heartbeat and its
    closing status, and another rank's failure, are written by different processes (and rank 0's heartbeat by a
    thread), so a heartbeat that read ``running`` just before rank k wrote ``failed`` would write ``running``
    back over it. An exclusive ``flock`` on the run dir itself (no file added to it); a run dir that cannot be
    opened is written without one."""
    try:
        fd = os.open(run_dir, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases its lock


def write_status(run_dir: str | Path, status: Mapping[str, Any], *, reserve: bool = False) -> None:
    """``status`` as the run dir's ``status.json``, atomically (a reader sees the old file or the new one);
    ``reserve``: padded with spaces to ``RESERVED_BYTES``. When the disk is full, written over the old
    file's bytes in place (without its traceback when it would not fit), else the ``OSError`` is raised."""
    p = layout.path(run_dir, layout.STATUS)
    text = _status_text(status)
    try:
        write_text_atomic(p, text.ljust(RESERVED_BYTES) if reserve else text)
    except OSError as e:
        if e.errno != errno.ENOSPC or not _overwrite_in_place(p, status):
            raise


def _status_text(status: Mapping[str, Any]) -> str:
    return json.dumps(dict(status), indent=2, default=json_default)


def _overwrite_in_place(p: Path, status: Mapping[str, Any]) -> bool:
    """``status`` over ``p``'s own bytes (no new blocks on a file system that overwrites in place), padded
    to its size; False when ``p`` is missing or too small even without the traceback."""
    try:
        size = p.stat().st_size
    except OSError:
        return False
    for candidate in (status, {k: v for k, v in status.items() if k != "traceback"}):
        data = _status_text(candidate).encode()
        if len(data) <= size:
            with open(p, "r+b") as f:
                f.write(data.ljust(size))
                f.flush()
                os.fsync(f.fileno())
            return True
    return False


def run_dir_busy(run_dir: str | Path, owner: dict) -> str:
    """The error of a launch into a run dir whose lock (``layout.LOCK``) another process holds."""
    return (f"run_dir={str(run_dir)!r} is being written by {describe_owner(owner)}: one process writes a run dir "
            f"at a time (wait for it to end, or use another run_dir)")


def new_heartbeat(step: int = 0) -> dict:
    """``pid_start``: when the pid's process started (``lock.process_start``), so a reused pid reads as gone."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "pid_start": process_start(os.getpid()),
            "time": time.time(), "step": int(step)}


_LAST_BEAT: dict[str, float] = {}
"""run dir -> when this process last wrote its heartbeat."""
_LAST_STEP: dict[str, int] = {}
"""run dir -> the step the loop last reported, written with the next renewal whoever makes it: the ``Heartbeat``
thread renews every ``HEARTBEAT_S`` and so keeps winning the loop's throttled beat, which would leave the
recorded step at 0 all run (and ``check_rerun_steps`` blind to how far a killed run got)."""
_BEATING = threading.Lock()
"""Held while a heartbeat reads and rewrites status.json (the loop's and the ``Heartbeat`` thread's), and while
the thread stops: no renewal lands over the closing status."""


def beat(run_dir: str | Path, step: Optional[int], *, every_s: Optional[float] = None) -> None:
    """Rank 0: renew the heartbeat of a ``running`` status this process wrote (``step``: the logged step; None keeps
    the one recorded), at most every ``every_s`` seconds (default ``HEARTBEAT_S``). Never raises: a missed heartbeat
    must not stop a run."""
    every_s = HEARTBEAT_S if every_s is None else every_s
    with _BEATING:
        key, now = str(run_dir), time.time()
        if step is not None:
            _LAST_STEP[key] = int(step)
        if now - _LAST_BEAT.get(key, 0.0) < every_s:
            return
        _LAST_BEAT[key] = now
        with status_update(run_dir):
            current = read_status(run_dir) or {}
            hb = current.get("heartbeat")
            if current.get("status") != "running" or not isinstance(hb, dict) or hb.get("pid") != os.getpid():
                return  # not ours (a failure another rank recorded, or another process's run)
            latest = _LAST_STEP.get(key)
            renewed = {**hb, "time": now, "step": int(hb.get("step") or 0) if latest is None else latest}
            try:
                write_status(run_dir, {**current, "heartbeat": renewed}, reserve=True)
            except OSError:
                pass


class Heartbeat:
    """A daemon thread renewing ``run_dir``'s heartbeat every ``every_s`` seconds (default ``HEARTBEAT_S``) from
    ``start()`` to ``stop()``: a run in its SFT or reward-model stage, or waiting on a cache entry's lock, logs no
    step for longer than ``refexp.record.lock.STALE_AFTER_S``, and must not read as stale from another host."""

    def __init__(self, run_dir: str | Path, *, every_s: Optional[float] = None) -> None:
        self.run_dir, self.every_s = run_dir, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="refexp-status-heartbeat")

    def start(self) -> "Heartbeat":
        self._thread.start()
        return self

    def _run(self) -> None:
        every_s = HEARTBEAT_S if self.every_s is None else self.every_s
        while not self._stop.wait(every_s):
            beat(self.run_dir, None, every_s=every_s / 2)  # not skipped for the loop's own beat of a moment ago

    def stop(self) -> None:
        """Stop renewing; returns once no renewal is in progress (the closing status goes after it)."""
        self._stop.set()
        with _BEATING:
            pass


def stale_reason(status: Mapping[str, Any], *, now: Optional[float] = None) -> Optional[str]:
    """Why a ``running`` status is stale (its process is gone: this host's pid is not alive, or another
    host's heartbeat is older than ``refexp.record.lock.STALE_AFTER_S``); None when it is not (alive, ended,
    or written before heartbeats existed)."""
    hb = status.get("heartbeat")
    if status.get("status") != "running" or not isinstance(hb, dict) or not isinstance(hb.get("time"), (int, float)):
        return None
    if owner_alive(hb, hb["time"], now=now):
        return None
    ago = (time.time() if now is None else now) - hb["time"]
    return (f"stale: its process (host {hb.get('host')}, pid {hb.get('pid')}) is gone; last heartbeat "
            f"{ago / 60:.0f} min ago at step {hb.get('step')}")


def wall_seconds(status: dict) -> float:
    """The seconds a run's invocations have run so far: ``wall_s`` (each invocation adds its own span, so a
    resumed run counts every part and a re-run of a finished one adds only its own short check), else the
    one span ``ended - started`` of a status written before ``wall_s`` existed, else 0 (an invocation
    killed before its closing write)."""
    if isinstance(status.get("wall_s"), (int, float)):
        return float(status["wall_s"])
    if isinstance(status.get("started"), (int, float)) and isinstance(status.get("ended"), (int, float)):
        return float(status["ended"]) - float(status["started"])
    return 0.0


def provenances(status: dict) -> list[dict]:
    """The code versions that computed a run (``provenances``: one per invocation that advanced it, in order;
    a status written before that field: its one ``provenance``)."""
    if isinstance(status.get("provenances"), list):
        return [p for p in status["provenances"] if isinstance(p, dict)]
    return [status["provenance"]] if isinstance(status.get("provenance"), dict) else []


def with_provenance(status: dict, earlier: dict) -> list[dict]:
    """``earlier``'s provenances, plus this invocation's (``status["provenance"]``) when it advanced the run
    (a re-run of a finished run computes nothing, so it does not claim the run's numbers) and differs from
    the last one recorded."""
    seen = provenances(earlier)
    advanced = not seen or int(status.get("last_step") or 0) > int(earlier.get("last_step") or 0)
    if advanced and (not seen or seen[-1] != status.get("provenance")):
        seen = [*seen, status["provenance"]]
    return seen


def record_rank_failure(run_dir: str | Path, rank: int, status: dict) -> None:
    """Rank ``rank``'s (> 0) failure as the run's status, unless a failure is recorded already."""
    with status_update(run_dir):
        current = read_status(run_dir) or {}
        if current.get("status") == "failed":
            return
        write_status(run_dir, {**current, **status, "status": "failed", "failed_rank": rank,
                               "error": f"rank {rank}: {status['error']}"})


def close_status(run_dir: str | Path, status: dict) -> dict:
    """Rank 0's final ``status``, written; a failure another rank recorded first stays the error, rank
    0's own then goes to ``rank0_error``. Returns what was written."""
    with status_update(run_dir):
        current = read_status(run_dir) or {}
        if status["status"] in ENDED and current.get("status") == "failed" and current.get("failed_rank", 0) != 0:
            status = {**status, "status": "failed", "error": current["error"], "failed_rank": current["failed_rank"],
                      "traceback": current.get("traceback"), "rank0_error": status.get("error")}
        write_status(run_dir, status)
    return status


def record_launch_failure(run_dir: str | Path, error: str) -> None:
    """The launching process's account of a job whose workers failed (``refexp/runtime/launcher.py``): written
    only when no rank left a failure (a worker killed by a signal or out of memory writes nothing)."""
    current = read_status(run_dir) or {}
    if current.get("status") in (*ENDED, "completed"):  # completed: a rerun that had not passed its end
        return
    write_status(run_dir, {**current, "status": "failed", "error": error, "final": current.get("final", {})})


def record_early_failure(run_dir: str | Path, error: BaseException) -> None:
    """A job that failed before it wrote a status (a config error) still leaves one for the report."""
    if not layout.path(run_dir, layout.STATUS).exists():
        write_status(run_dir, {"status": "failed", "error": f"{type(error).__name__}: {error}", "final": {}})


def first_started(status: dict) -> Optional[float]:
    """When a run's first invocation started: ``first_started``, else (a status written before that field, or by
    one invocation) its ``started``; None without either."""
    for key in ("first_started", "started"):
        if isinstance(status.get(key), (int, float)) and not isinstance(status.get(key), bool):
            return float(status[key])
    return None


def open_status(run_dir: str | Path, status: RunStatus) -> dict:
    """Rank 0 at the start of an invocation: ``status`` written; returns the status of the run dir's earlier
    invocations ({} when none), read before it is written over."""
    earlier = read_status(run_dir) or {}
    status.first_started = first_started(earlier) or status.started
    status.heartbeat = new_heartbeat()
    write_status(run_dir, status.to_json(), reserve=True)
    _LAST_BEAT[str(run_dir)] = status.heartbeat["time"]
    _LAST_STEP.pop(str(run_dir), None)  # an earlier invocation's step in this process is not this one's
    return earlier


def close_run_status(run_dir: str | Path, status: RunStatus, earlier: dict, rank: int) -> None:
    """The end of an invocation on rank ``rank``: rank 0 writes the run's status (its wall time and
    provenances counting ``earlier``'s invocations); a failed rank > 0 records its failure first. An
    invocation that stopped before it advanced a completed run writes that run's status back as it was."""
    status.ended, status.heartbeat = time.time(), None
    if rank == 0 and status.status != "completed" and earlier.get("status") == "completed" \
            and status.last_step <= int(earlier.get("last_step") or 0):
        write_status(run_dir, earlier)
    elif rank == 0:
        status.wall_s = wall_seconds(earlier) + status.ended - status.started
        status.provenances = with_provenance(status.to_json(), earlier)
        close_status(run_dir, status.to_json())
    elif status.status == "failed":
        record_rank_failure(run_dir, rank, status.to_json())  # before this process exits and the launcher stops rank 0
