"""Append-only JSON-lines files of the run record (metrics, samples, evaluation outcomes): the one
tolerant reader and the rewrite a resumed run makes.

A run that is still going, or was killed, can leave a half-written last line; readers skip it (and
count it), and no reader raises on a missing or broken file.
"""

from __future__ import annotations

import json
import numbers
import os
from pathlib import Path

from refexp.record.atomic import write_text_atomic


class Rows(list):
    """The rows of a JSON-lines file (a list of dicts) and ``bad_lines``: how many lines could not be used."""

    bad_lines: int = 0


def _is_step(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def read_rows(path: str | os.PathLike) -> Rows:
    """Every line of ``path`` that parses as an object with a numeric ``step``; blank lines are skipped, and
    other lines (a torn last line from a kill) are counted in ``bad_lines``. A missing file: no rows."""
    rows = Rows()
    try:
        f = open(path)
    except OSError:
        return rows
    with f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                rows.bad_lines += 1
                continue
            if isinstance(row, dict) and _is_step(row.get("step")):
                rows.append(row)
            else:
                rows.bad_lines += 1
    return rows


def line(row: dict) -> str:
    """One row as its line of the file."""
    return json.dumps(row) + "\n"


def keep_until(path: str | os.PathLike, step: int) -> Rows:
    """Rewrite ``path`` (atomically) without its rows after ``step``; returns the kept rows. A resumed run
    logs the steps after its last checkpoint again. A file with nothing to drop is not rewritten."""
    rows = read_rows(path)
    keep = Rows(r for r in rows if r["step"] <= step)
    if len(keep) == len(rows) and not rows.bad_lines:
        return keep
    write_text_atomic(Path(path), "".join(line(r) for r in keep))
    return keep
