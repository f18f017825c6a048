"""The setup block of a report: what the compared runs were (algorithm, model, task, budget, the knobs
that decide the numbers), which code and libraries made them, and how long they took.

A value every run of the algorithm shares is shown once; one that differs is shown as the set of its
values, so a reader sees at once what the sweep varied.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from refexp.record.metric_names import EVAL_ACCURACY, VAL_ACCURACY
from refexp.record.status import provenances, wall_seconds
from refexp.report.reading.comparison_plan import ComparisonPlan, threads
from refexp.report.reading.config_history import ConfigHistory
from refexp.report.reading.group import Group
from refexp.report.reading.load import Run, _get, natural_key

FIELDS: tuple[tuple[str, str], ...] = (
    ("model", "model.name"), ("pretrained", "model.pretrained"), ("flavor", "model.flavor"),
    ("hf checkpoint", "model.hf_assets_path"),
    ("task", "task.name"), ("demonstration slip", "task.demo_slip"),
    ("steps", "training.steps"), ("lr", "training.lr"), ("beta", "algo.beta"),
    ("loss", "algo.loss_type"), ("prompts x group", None), ("pairs per step", "algo.pairs_per_step"),
    ("eval prompts", "eval.num_prompts"), ("eval every", "eval.every"),
)
"""(label, dotted config key); the None key is computed (GRPO's prompts_per_step x group_size)."""


def _value(run: Run, key: str | None) -> Any:
    if key == "model.flavor" and _get(run.config, "model.hf_assets_path"):  # config.json overrides its shapes
        return f"{_get(run.config, key)}, its shapes replaced by the checkpoint's config.json"
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


def _at_step_0(runs: list[Run], key: str) -> str | None:
    """The runs' ``key`` at step 0 (the start they trained from), one value when they agree."""
    values = []
    for r in runs:
        steps, v = r.series(key)
        if len(steps) and steps[0] == 0:
            values.append(f"{v[0]:.3f}")
    return _shown(values)


def sft_start(runs: list[Run]) -> str | None:
    """The start the runs trained from, as their ``status.json`` records it (``sft_start``: the SFT cache entry's
    key and its validation accuracy; several values: the runs did not share one start); for runs that predate
    that record, ``sft.checkpoint``'s directory name when given and the accuracies they logged at step 0."""
    recorded = [s for s in ((r.status or {}).get("sft_start") for r in runs) if isinstance(s, dict)]
    if recorded:
        keys = _shown([str(s.get("key")) for s in recorded])
        vals = _shown([f"{s['val_accuracy']:.3f}" for s in recorded if s.get("val_accuracy") is not None])
        return f"{keys}" + (f" (validation accuracy {vals})" if vals else "") + start_flags(recorded)
    given = _shown([Path(c).name for c in (_get(r.config, "sft.checkpoint") for r in runs) if c])
    where = f"sft.checkpoint {given}" if given else "an SFT cache entry (these runs predate its record in status.json)"
    val, test = _at_step_0(runs, VAL_ACCURACY), _at_step_0(runs, EVAL_ACCURACY)
    accs = ", ".join(t for t in (f"validation accuracy {val}" if val else "", f"test accuracy {test}" if test else "")
                     if t)
    return f"{where}; {accs} at step 0" if accs else where


def start_flags(recorded: list[dict]) -> str:
    """``; `` + each distinct way the recorded starts (``status.json``'s ``sft_start``) fall short of a converged
    start (``refexp/algos/sft_checks.py``), or "" for starts that do not."""
    flags = sorted({w.split(":")[0] for s in recorded for w in s.get("warnings") or []})
    return "".join(f"; {f}" for f in flags)


def sft_starts(runs: list[Run]) -> list[tuple[str, str]]:
    """(start key, what it was) per SFT start the runs trained from (``Run.sft_start``), in natural order: its
    ``sft.seed`` and validation accuracy as ``status.json`` records them (else the validation accuracy logged at
    step 0)."""
    by_start: dict[str, list[Run]] = {}
    for r in runs:
        by_start.setdefault(r.sft_start, []).append(r)
    out = []
    for key in sorted(by_start, key=natural_key):
        rs = by_start[key]
        recorded = [s for s in ((r.status or {}).get("sft_start") for r in rs) if isinstance(s, dict)]
        val = _shown([f"{s['val_accuracy']:.3f}" for s in recorded if s.get("val_accuracy") is not None]) \
            or _at_step_0(rs, VAL_ACCURACY)
        seed = _shown([_get(r.config, "sft.seed") for r in rs])
        what = ", ".join(t for t in (f"sft.seed {seed}" if seed is not None and not key.startswith("sft.seed=")
                                     else "", f"validation accuracy {val}" if val else "") if t)
        out.append((key or "not recorded", what + start_flags(recorded)))
    return out


def comparison_rows(plan: ComparisonPlan, runs: list[Run]) -> list[tuple[str, str]]:
    """The comparison the verdict reads, the runs it leaves out and why, and the hyper-parameters chosen on test."""
    rows = [("comparison", plan.kind)]
    if plan.block is not None:
        b = plan.block
        rows.append(("declared", f"arms {', '.join(map(str, b['arms']))} ({b['arm_key']}); baseline {b['baseline']}; "
                                 f"seeds {', '.join(map(str, b.get('seeds', [])))}; metric {plan.metric}"
                     + (f"; at steps {', '.join(map(str, plan.at_steps))}" if plan.at_steps else "")))
    elif plan.baseline is not None:
        rows.append(("baseline", f"{plan.baseline} ({plan.baseline_why})"))
    names = {r.name for r in runs}
    left = [f"run {name}: {why}" for name, why in plan.excluded.items() if name in names]
    if left:
        label = "outside the plan, counted (--allow-mixed)" if plan.allow_mixed else "left out of the verdict"
        rows.append((label, "; ".join(left)))
    if plan.chosen_on_test:
        rows.append(("chosen on test", ", ".join(plan.chosen_on_test) + " (picked by looking at held-out test "
                     "accuracy, not validation: the verdict favours the arms they were tuned for)"))
    rows += [("note", n) for n in plan.notes]
    return rows


def setup_rows(groups: list[Group], plan: ComparisonPlan | None = None,
               configs: tuple[ConfigHistory, ...] = ()) -> list[tuple[str, str]]:
    """``(label, value)`` rows describing every run of one algorithm's groups (failed ones too); ``configs``: the
    experiment files the sweep's runs were launched with (``config_history.histories``)."""
    runs = [r for g in groups for r in g.runs]
    rows = []
    for label, key in FIELDS:
        shown = _shown([_value(r, key) for r in runs])
        if shown is not None:
            if label == "hf checkpoint":
                shown = " | ".join(Path(v).name for v in shown.split(" | "))  # a dir name, not a machine path
            rows.append((label, shown))
    # an unfinished run records its start only when it ends: beside runs that did, it is no start of its own
    recorded = [isinstance((r.status or {}).get("sft_start"), dict) for r in runs]
    some = any(recorded)
    waiting = [some and r.problem is not None and not rec for r, rec in zip(runs, recorded)]
    pending = [r for r, w in zip(runs, waiting) if w]
    known = [r for r, w in zip(runs, waiting) if not w]
    starts = sft_starts(known)
    later = (f"; {len(pending)} unfinished run{'s' * (len(pending) != 1)} not yet recorded" if pending else "")
    if len(starts) > 1:  # a factor of the sweep: the verdicts nest the seeds in them (paired.py)
        rows.append(("SFT starts", f"{len(starts)}: " + "; ".join(f"{k} ({w})" if w else k for k, w in starts)
                     + later))
    else:
        start = sft_start(known)
        if start:
            rows.append(("SFT start", start + later))
    n_threads = _shown([threads(r) for r in runs])
    if n_threads is not None:
        rows.append(("training.num_threads", n_threads))
    seeds = sorted({r.seed for r in runs if r.seed is not None})
    if seeds:
        rows.append(("seeds", ", ".join(map(str, seeds))))
    commit, versions = _provenance(runs)
    if commit:
        rows.append(("refexp commit", commit))
    if configs:
        rows.append(("experiment config", " | ".join(c.line() for c in configs)))
    if versions:
        rows.append(("versions", versions))
    wall = _wall_time(runs)
    if wall:
        rows.append(("wall time", wall))
    return rows + (comparison_rows(plan, runs) if plan is not None else [])
