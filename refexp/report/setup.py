"""The setup block of a report: what the compared runs were (algorithm, model, task, budget, the knobs
that decide the numbers), which code and libraries made them, and how long they took.

A value every run of the algorithm shares is shown once; one that differs is shown as the set of its
values, so a reader sees at once what the sweep varied.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from refexp.record.status import provenances, wall_seconds

from .group import Group
from .load import Run, _get

FIELDS: tuple[tuple[str, str], ...] = (
    ("model", "model.name"), ("flavor", "model.flavor"), ("hf checkpoint", "model.hf_assets_path"),
    ("task", "task.name"), ("demonstration slip", "task.demo_slip"),
    ("steps", "training.steps"), ("lr", "training.lr"), ("beta", "algo.beta"),
    ("loss", "algo.loss_type"), ("prompts x group", None), ("pairs per step", "algo.pairs_per_step"),
    ("eval prompts", "eval.num_prompts"), ("eval every", "eval.every"),
)
"""(label, dotted config key); the None key is computed (GRPO's prompts_per_step x group_size)."""


def _value(run: Run, key: str | None) -> Any:
    if key is None:
        p, g = _get(run.config, "algo.prompts_per_step"), _get(run.config, "algo.group_size")
        return f"{p} x {g}" if p is not None and g is not None else None
    return _get(run.config, key)


def _shown(values: list[Any]) -> str | None:
    """One value, or ``a | b`` for the distinct ones in first-seen order; None when no run has it."""
    distinct = list(dict.fromkeys(str(v) for v in values if v is not None))
    if not distinct:
        return None
    return distinct[0] if len(distinct) == 1 else " | ".join(distinct)


def _wall_time(runs: list[Run]) -> str | None:
    """Total and per-run wall time: status.json's ``wall_s`` (every invocation of a resumed run), else its
    ``ended - started``."""
    spans = [wall_seconds(r.status) for r in runs if r.status and ("wall_s" in r.status or "ended" in r.status)]
    if not spans:
        return None
    total = sum(spans)
    return f"{total / 60:.1f} min in {len(spans)} runs ({total / len(spans) / 60:.1f} min each)"


def _provenance(runs: list[Run]) -> tuple[str | None, str | None]:
    """(the refexp commit(s), the library versions) recorded in the runs' status.json."""
    provs = [p for r in runs if r.status for p in provenances(r.status)]
    if not provs:
        return None, None
    commit = _shown([p.get("commit") for p in provs])
    versions = _shown([", ".join(f"{k} {v}" for k, v in sorted((p.get("versions") or {}).items()))
                       + f", python {p.get('python')}" for p in provs])
    return commit, versions


def setup_rows(groups: list[Group]) -> list[tuple[str, str]]:
    """``(label, value)`` rows describing every run of one algorithm's groups (failed ones too)."""
    runs = [r for g in groups for r in g.runs]
    rows = []
    for label, key in FIELDS:
        shown = _shown([_value(r, key) for r in runs])
        if shown is not None:
            if label == "hf checkpoint":
                shown = " | ".join(Path(v).name for v in shown.split(" | "))  # a dir name, not a machine path
            rows.append((label, shown))
    seeds = sorted({r.seed for r in runs if r.seed is not None})
    if seeds:
        rows.append(("seeds", ", ".join(map(str, seeds))))
    commit, versions = _provenance(runs)
    if commit:
        rows.append(("refexp commit", commit))
    if versions:
        rows.append(("versions", versions))
    wall = _wall_time(runs)
    if wall:
        rows.append(("wall time", wall))
    return rows
