"""A sweep's notes of the jobs that raised: one line each in ``<sweep dir>/.refexp-failed-jobs.jsonl``, appended by the
job (``refexp/run.py``, also in a launcher's worker process) and read by the sweep's ``JobsCallback``
(``refexp/cli/sweep.py``), which makes the sweep exit 1. A refused rerun raises without a status of its own (its run
dir keeps the completed run's), so its status alone would not say it failed.
"""

from __future__ import annotations

import json
from pathlib import Path

FAILED_JOBS = ".refexp-failed-jobs.jsonl"
"""In the sweep dir: one ``{run_dir, error}`` line per job that raised (``record_failed_job``)."""


def record_failed_job(sweep_dir: str | Path, run_dir: str | Path, error: BaseException) -> None:
    """Note in ``sweep_dir`` that the job of ``run_dir`` raised ``error``: one short line, in one write to a file
    opened for appending (jobs side by side add their lines whole, on a local file system)."""
    first = str(error).splitlines()[0] if str(error) else ""
    line = json.dumps({"run_dir": str(run_dir), "error": f"{type(error).__name__}: {first}"[:300]}) + "\n"
    Path(sweep_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(sweep_dir) / FAILED_JOBS, "a") as f:
        f.write(line)


def failed_jobs(sweep_dir: str | Path) -> dict[str, str]:
    """``{run dir: error}`` of the jobs of ``sweep_dir``'s last sweep that raised (``record_failed_job``)."""
    out = {}
    try:
        lines = (Path(sweep_dir) / FAILED_JOBS).read_text().splitlines()
    except OSError:
        return out
    for text in lines:
        try:
            row = json.loads(text)
            out[str(row["run_dir"])] = str(row["error"])
        except (ValueError, KeyError, TypeError):
            continue
    return out
