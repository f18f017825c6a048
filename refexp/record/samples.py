"""``samples.jsonl``: sample completions (``eval.log_samples``), each row ``{step, kind, prompt, completion,
answer, reward, ...}``; ``kind`` is ``eval`` (greedy held-out completions at every evaluation) or ``rollout``
(GRPO's first rollouts of an evaluation step). One writer, one reader.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from refexp.record import layout
from refexp.record.jsonl import Rows, line, read_rows


def append_samples(run_dir: str | Path, step: int, samples: Mapping[str, list[dict]]) -> None:
    """``{kind: rows}`` of one step, appended."""
    with open(layout.path(run_dir, layout.SAMPLES), "a") as f:
        for kind, rows in samples.items():
            for r in rows:
                f.write(line({"step": step, "kind": kind, **r}))


def read_samples(run_dir: str | Path, kind: str | None = None) -> Rows:
    """The rows of ``samples.jsonl`` (of one ``kind`` when given), in the order written."""
    rows = read_rows(layout.path(run_dir, layout.SAMPLES))
    if kind is None:
        return rows
    out = Rows(r for r in rows if r.get("kind") == kind)
    out.bad_lines = rows.bad_lines
    return out
