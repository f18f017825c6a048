"""``status.json``: what became of a run (running / completed / failed / preempted, with the error).

Rank 0 writes it at the start and at the end. A failure on another rank must reach it too, and
first: the launcher (torchrun, ``refexp/launcher.py``) stops the surviving ranks when one process
fails, and rank 0 may be killed inside a collective before it writes anything, or fail itself with
nothing more telling than gloo's "Connection closed by peer". So a failing rank k > 0 writes its own
error into ``status.json`` before its process exits (``record_rank_failure``), and rank 0's closing
write keeps that error as the run's (``close_status``). The first failure recorded wins: it is the
root cause, the later ones follow from it.
"""

from __future__ import annotations

import json
from pathlib import Path

from refexp.io import write_json_atomic

ENDED = ("failed", "preempted")


def status_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "status.json"


def read_status(run_dir: str | Path) -> dict | None:
    """The run dir's status, or None when it has none (or a half-written one from an older version)."""
    try:
        return json.loads(status_path(run_dir).read_text())
    except (OSError, ValueError):
        return None


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
    current = read_status(run_dir) or {}
    if current.get("status") == "failed":
        return
    write_json_atomic(status_path(run_dir), {**current, **status, "status": "failed", "failed_rank": rank,
                                             "error": f"rank {rank}: {status['error']}"})


def close_status(run_dir: str | Path, status: dict) -> dict:
    """Rank 0's final ``status``, written; a failure another rank recorded first stays the error, rank
    0's own then goes to ``rank0_error``. Returns what was written."""
    current = read_status(run_dir) or {}
    if status["status"] in ENDED and current.get("status") == "failed" and current.get("failed_rank", 0) != 0:
        status = {**status, "status": "failed", "error": current["error"], "failed_rank": current["failed_rank"],
                  "traceback": current.get("traceback"), "rank0_error": status.get("error")}
    write_json_atomic(status_path(run_dir), status)
    return status


def record_launch_failure(run_dir: str | Path, error: str) -> None:
    """The launching process's account of a job whose workers failed (``refexp/launcher.py``): written
    only when no rank left a failure (a worker killed by a signal or out of memory writes nothing)."""
    current = read_status(run_dir) or {}
    if current.get("status") in ENDED:
        return
    write_json_atomic(status_path(run_dir), {**current, "status": "failed", "error": error,
                                             "final": current.get("final", {})})
