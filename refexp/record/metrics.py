"""``metrics.jsonl``: one JSON object per logged step, with ``step`` (the contract with the report; W&B
receives the same rows). ``MetricsWriter`` is its one writer (``refexp/components/metric_logger.py`` drives it),
``read_metrics`` its one reader.
"""

from __future__ import annotations

from pathlib import Path

from refexp.record import layout
from refexp.record.jsonl import Rows, keep_until, line, read_rows


def read_metrics(run_dir: str | Path) -> Rows:
    """The rows of ``<run_dir>/metrics.jsonl`` in the order logged (a step logged twice by a resumed run that
    was killed before truncating appears twice); ``.bad_lines`` counts the unusable lines (a torn last one)."""
    return read_rows(layout.path(run_dir, layout.METRICS))


class MetricsWriter:
    """Appends rows to ``<run_dir>/metrics.jsonl``, line-buffered: a kill loses at most one line."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = layout.path(run_dir, layout.METRICS)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", buffering=1)

    def write(self, row: dict) -> None:
        """One step's row (``row["step"]``: int; values JSON numbers)."""
        self._file.write(line(row))

    def keep_until(self, step: int) -> Rows:
        """Drop the rows after ``step`` (a resumed run logs them again); returns the kept rows."""
        self._file.close()
        kept = keep_until(self.path, step)
        self._file = open(self.path, "a", buffering=1)
        return kept

    def close(self) -> None:
        self._file.close()
