"""Variance components of arm - baseline differences (``detectable.Components``) estimated from a pilot: a sweep dir
(per-prompt outcomes: every component) or a report's summary.json (per-seed and per-start differences: the
prompts' share is bounded, not measured).

From a sweep, per comparison: the differences d[u, p] of unit u = (SFT start, seed) on the prompts every unit
scored, a units × prompts table analysed by the method of moments (two-way without replication; units nested in
starts): residual = the interaction mean square; prompt = (prompt mean square - residual) / U; seed = the pooled
within-start variance of the unit means - residual / P; start = the variance of the start means - the within-start
variance / K (K the harmonic mean of seeds per start). Negative estimates are 0. The pilot's comparisons (every arm
against its baseline) are averaged component by component.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from statistics import harmonic_mean
from typing import Optional

import numpy as np

from refexp.report.power.detectable import Components
from refexp.report.power.pilot_summary import check_summary
from refexp.report.reading.comparison_plan import PRIMARY_ENDPOINTS, make_plan
from refexp.report.reading.group import group_runs
from refexp.report.reading.load import load_sweep
from refexp.report.statistics.paired import final_step
from refexp.report.statistics.summary import find_baseline, in_comparison


class PilotError(ValueError):
    """The pilot cannot give variance components (no run, no comparison, too few units): the message says why."""


@dataclass
class Pilot:
    """The components and where they came from."""

    source: str
    components: Components
    comparisons: list[str]
    """The comparisons averaged, ``arm - baseline``."""
    prompts: Optional[int]
    """Prompts per evaluation in the pilot (the design's where the experiment does not set eval.num_prompts)."""
    notes: list[str] = field(default_factory=list)
    metric: str = "eval/accuracy"
    """The metric whose differences gave the components (``read_pilot``'s)."""


def _moments(units: dict[str, dict[int, np.ndarray]]) -> tuple[float, float, float, Optional[float], list[str]]:
    """(start, seed, prompt, residual, notes) of one comparison: start -> seed -> d[p] on the common prompts."""
    rows = [(s, d) for s, seeds in units.items() for d in seeds.values()]
    table = np.array([d for _, d in rows])  # [U, P]
    n_units, n_prompts = table.shape
    notes = []
    unit_mean, prompt_mean, grand = table.mean(1), table.mean(0), table.mean()
    inter = table - unit_mean[:, None] - prompt_mean[None, :] + grand
    residual = (float((inter ** 2).sum() / ((n_units - 1) * (n_prompts - 1))) if n_units > 1
                else float(table.var(ddof=1)))
    prompt = max(0.0, (n_units * float(((prompt_mean - grand) ** 2).sum()) / (n_prompts - 1) - residual) / n_units)
    if n_units == 1:
        notes.append("one unit: the prompt and residual variances are not told apart")
    by_start = [np.array([d.mean() for d in seeds.values()]) for seeds in units.values()]
    dof = sum(len(m) - 1 for m in by_start)
    within = float(sum(((m - m.mean()) ** 2).sum() for m in by_start) / dof) if dof else None
    seed = max(0.0, within - residual / n_prompts) if within is not None else 0.0
    if within is None:
        notes.append("one seed per start: the seeds' variance is not estimable, taken as 0")
    start = 0.0
    if len(by_start) >= 2:
        k = harmonic_mean([len(m) for m in by_start])
        start = max(0.0, float(np.var([m.mean() for m in by_start], ddof=1)) - (within or 0.0) / k)
    else:
        notes.append("one SFT start: the starts' variance is not estimable, taken as 0")
    return start, seed, prompt, residual, notes


def from_sweep(sweep_dir: Path, metric: str = "eval/accuracy") -> Pilot:
    """Components of ``metric``'s final differences from every comparison of a sweep's report (its declared or
    exploratory baseline, its counted runs)."""
    return from_runs(load_sweep(Path(sweep_dir)), str(sweep_dir), metric)


def from_runs(runs: list, sweep_dir: str, metric: str = "eval/accuracy") -> Pilot:
    """``from_sweep`` of runs already read (``sweep_dir``: where they came from, for the messages)."""
    if not runs:
        raise PilotError(f"--pilot {sweep_dir}: no runs found (a run dir has .hydra/, status.json or metrics.jsonl)")
    plan = make_plan(runs)
    estimates, labels, notes, prompts = [], [], [], set()
    for groups in group_runs(runs).values():
        base, _ = find_baseline(groups, plan)
        if base is None:
            continue
        base_runs = {(r.sft_start, r.seed): r for r in base.completed if plan.counts(r)}
        for g in groups:
            if g is base or not in_comparison(g, plan):
                continue
            units: dict[str, dict[int, dict[int, float]]] = {}
            for r in g.completed:
                b = base_runs.get((r.sft_start, r.seed))
                sa, sb = final_step(r, metric), final_step(b, metric) if b is not None and plan.counts(r) else None
                if sa is None or sb is None:
                    continue
                a, o = r.outcomes_of(metric)[sa], b.outcomes_of(metric)[sb]
                units.setdefault(r.sft_start, {})[r.seed] = {i: a[i] - o[i] for i in a if i in o}
            flat = [d for seeds in units.values() for d in seeds.values()]
            common = sorted(set.intersection(*(set(d) for d in flat))) if flat else []
            if len(flat) < 2 or len(common) < 2:
                continue
            prompts.add(len(common))
            *est, more = _moments({s: {k: np.array([d[i] for i in common]) for k, d in seeds.items()}
                                   for s, seeds in units.items()})
            estimates.append(est)
            labels.append(f"{g.label} - {base.label}")
            notes += [n for n in more if n not in notes]
    if not estimates:
        raise PilotError(f"--pilot {sweep_dir}: no comparison with per-prompt {metric} outcomes on two or more "
                         f"paired (start, seed) units")
    start, seed, prompt, residual = (float(np.mean(x)) for x in zip(*estimates))
    return Pilot(str(sweep_dir), Components(start, seed, prompt, residual), labels,
                 min(prompts) if prompts else None, notes)


def from_summary(path: Path, metric: str = "eval/accuracy") -> Pilot:
    """Components from a report's summary.json: seed and start from the per-seed and per-start differences it
    records (the seeds' at the pilot's prompts: the residual is not separable), prompt at its binomial bound
    p_a (1 - p_a) + p_b (1 - p_b) (the variance of one prompt's difference when the two arms' outcomes on a prompt
    are not negatively correlated): a summary holds no per-prompt outcomes, so the bound overstates it."""
    key = PRIMARY_ENDPOINTS.get(metric)
    try:
        summary = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise PilotError(f"--pilot {path}: not a readable summary.json ({e})") from e
    check_summary(summary, key, lambda why: PilotError(f"--pilot {path}: {why}"))
    estimates, labels, notes, prompts = [], [], [], set()
    for algo in (summary.get("algos") or {}).values():
        groups = {g["label"]: g for g in algo.get("groups", [])}
        base = groups.get(algo.get("baseline"))
        for label, g in groups.items():
            c = (g.get("paired_vs_baseline") or {}).get(key)
            if base is None or not c or not (c.get("seed_only_t95") or {}).get("values"):
                continue
            starts = list(dict.fromkeys(c.get("sft_starts") or [""]))
            top = np.array(c["seed_only_t95"]["values"], dtype=float)
            if len(starts) >= 2:
                inside = [(((algo.get("within_sft_start") or {}).get(s, {}).get("paired_vs_baseline", {})
                            .get(label, {}).get(key) or {}).get("seed_only_t95") or {}).get("values") for s in starts]
                inside = [np.array(v, dtype=float) for v in inside if v]
            else:
                inside = [top]
            dof = sum(len(v) - 1 for v in inside)
            seed = float(sum(((v - v.mean()) ** 2).sum() for v in inside) / dof) if dof else 0.0
            if not dof:
                notes.append("one seed per start: the seeds' variance is not estimable, taken as 0")
            start = 0.0
            if len(starts) >= 2 and len(top) >= 2:
                k = harmonic_mean([len(v) for v in inside]) if inside else 1.0
                start = max(0.0, float(np.var(top, ddof=1)) - seed / k)
            elif len(starts) < 2:
                notes.append("one SFT start: the starts' variance is not estimable, taken as 0")
            pa, pb = ((x.get("metrics", {}).get(key) or {}).get("mean") for x in (g, base))
            if pa is None or pb is None:
                continue
            estimates.append((start, seed, pa * (1 - pa) + pb * (1 - pb)))
            labels.append(f"{label} - {base['label']}")
            n = (base.get("metrics", {}).get(key) or {}).get("eval_prompts")
            if n:
                prompts.add(int(n))
    notes = list(dict.fromkeys(notes)) + [
        "a summary holds no per-prompt outcomes: the prompts' variance is its binomial upper bound and the "
        "residual is inside the seeds' variance (measured at the pilot's prompts)"]
    if not estimates:
        raise PilotError(f"--pilot {path}: no comparison on {metric} ({key}) with per-seed differences")
    start, seed, prompt = (float(np.mean(x)) for x in zip(*estimates))
    return Pilot(str(path), Components(start, seed, prompt, None), labels, min(prompts) if prompts else None,
                 list(dict.fromkeys(notes)))


def read_pilot(path: Path, metric: str = "eval/accuracy") -> Pilot:
    """A sweep dir, or a summary.json (or a dir holding one and no runs)."""
    path = Path(path)
    if not path.is_file() and not path.is_dir():
        raise PilotError(f"--pilot {path}: neither a sweep dir nor a summary.json")
    if path.is_file():
        pilot = from_summary(path, metric)
    elif not load_sweep(path) and (path / "summary.json").is_file():
        pilot = from_summary(path / "summary.json", metric)
    else:
        pilot = from_sweep(path, metric)
    pilot.metric = metric
    return pilot
