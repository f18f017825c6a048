"""The primary contrasts of ``comparison.matched.estimand: crossing``: each arm of ``comparison.primary`` against the
baseline where each run's drift first passes each declared value, on each primary metric (``trajectory_crossing.py``
reads the runs); ``declared_matched.py`` dispatches here.

The family is the frontier estimand's: Holm over the declared contrasts (one that makes no claim counts with p 1),
the margin's two one-sided tests, the verdict words, the first screen and its forest plot (``family_verdicts``,
``MatchedRow`` and ``MatchedDrift`` alike). A value some replicate of either arm cannot be read at makes no claim,
every failing replicate counted by reason for each arm with one in numbers. The gap rules and ``along`` read across
runs and do not apply here; each run's drift at its crossing is taken as exact (the drift resample re-reads curves of
final points, not a run's own evaluations).
"""

from __future__ import annotations

from collections import Counter
from typing import Optional

import numpy as np

from refexp.report.reading.comparison_plan import ComparisonPlan
from refexp.report.reading.load import Run, natural_key
from refexp.report.statistics.drift_crossing import REASONS
from refexp.report.statistics.frontier import (
    MatchedDrift,
    MatchedRow,
    common_settings,
    curve_label,
    frontier_gap,
    planned_runs,
)
from refexp.report.statistics.frontier_points import Axis
from refexp.report.statistics.inference import difference_bound, family_verdicts
from refexp.report.statistics.metric_scores import paired_result
from refexp.report.statistics.paired import Unit
from refexp.report.statistics.trajectory_crossing import ReplicateReading, read_replicate, trajectory, unit_pair
from refexp.report.statistics.unread import replicate_name

Curve = dict[Unit, list[Run]]
"""(SFT start, seed) -> an arm's runs in it (across the frontier key) with evaluations after step 0."""


def run_curves(runs: list[Run], plan: ComparisonPlan, axis: str, metric: str) -> dict[str, Curve]:
    """Curve label (``frontier.curve_label``) -> its planned runs by replicate, those with a trajectory only."""
    planned = planned_runs(runs, plan)
    common = common_settings(planned)
    out: dict[str, Curve] = {}
    for r in planned:
        if trajectory(r, axis, metric):
            out.setdefault(curve_label(r, plan, common), {}).setdefault((r.sft_start, r.seed), []).append(r)
    return out


def declared_crossing(runs: list[Run], plan: ComparisonPlan) -> Optional[MatchedDrift]:
    """The primary family read at the declared crossings; None when the plan declares none."""
    axis_key, values = plan.matched_at
    if not values or not plan.primary or not (plan.block or {}).get("frontier_key"):
        return None
    metrics = plan.primary_metrics
    out = MatchedDrift(Axis(axis_key, True), ", ".join(metrics), plan.baseline, gap=frontier_gap(plan),
                       max_gap=plan.max_gap, estimand="crossing")
    results = {}
    for metric in metrics:
        cs = run_curves(runs, plan, axis_key, metric)
        by_arm: dict[str, list[str]] = {}
        for label, by_unit in cs.items():
            by_arm.setdefault(plan.arm(next(iter(by_unit.values()))[0]), []).append(label)
        for arm in plan.primary:
            for x in values:
                label = f"{arm} at {axis_key} {x:.3g}" + (f" [{metric}]" if len(metrics) > 1 else "")
                curves = [("the baseline", by_arm.get(plan.baseline, [])), (arm, by_arm.get(arm, []))]
                row = _row(cs, curves, arm, x, axis_key, metric, label, plan)
                row.metric = metric
                out.rows.append(row)
                if row.result is not None:
                    results[label] = row.result
    bounds = {difference_bound(m) for m in metrics}
    out.verdicts = family_verdicts(results, alpha=plan.alpha, margin=plan.margin,
                                   bound=bounds.pop() if len(bounds) == 1 else None,
                                   untested=len(out.rows) - len(results))
    out.text = _text(out, plan, values)
    return out


def _row(cs: dict[str, Curve], curves: list[tuple[str, list[str]]], arm: str, x: float, axis: str, metric: str,
         label: str, plan: ComparisonPlan) -> MatchedRow:
    """One primary contrast at one declared value, or its reason for making no claim."""
    key = plan.block["frontier_key"]
    for who, labels in curves:
        if len(labels) != 1:
            what = "no curve" if not labels else f"{len(labels)} curves ({', '.join(labels)})"
            return MatchedRow(arm, x, [], label, no_claim=f"{who} has {what} across {key}: a declared contrast needs "
                                                          f"one, of completed runs with evaluations after step 0")
    base_c, arm_c = cs[curves[0][1][0]], cs[curves[1][1][0]]
    seeds = sorted((u for u in arm_c if u in base_c), key=lambda u: (natural_key(u[0]), u[1]))
    if len(seeds) < 2:
        return MatchedRow(arm, x, seeds, label, no_claim=f"fewer than 2 replicates (SFT start, seed) in which both "
                                                         f"{arm} and the baseline have a run")
    read = {who: {u: read_replicate(c[u], axis, metric, x) for u in seeds}
            for who, c in (("the baseline", base_c), (arm, arm_c))}
    why = not_read(read, seeds, x, axis)
    if why:
        return MatchedRow(arm, x, seeds, label, no_claim=why)
    base_r, arm_r = read["the baseline"], read[arm]
    result = paired_result({u: unit_pair(arm_r[u], base_r[u]) for u in seeds})
    return MatchedRow(arm, x, seeds, label, result, brackets={plan.baseline: _span(base_r), arm: _span(arm_r)},
                      other_chord=_linear_point(arm_r, base_r, seeds))


def _span(read: dict[Unit, ReplicateReading]) -> tuple[float, float]:
    """(lower, upper): the medians, over the runs that pass x, of the drift at the two evaluations each is read
    between."""
    cs = [c for r in read.values() for c in r.crossings]
    return float(np.median([c.xs[0] for c in cs])), float(np.median([c.xs[1] for c in cs]))


def _linear_point(arm: dict[Unit, ReplicateReading], base: dict[Unit, ReplicateReading], seeds: list[Unit]) -> float:
    """arm - baseline with every run's chord drawn in linear drift (the mean over starts of the mean over seeds)."""
    by_start: dict[str, list[float]] = {}
    for u in seeds:
        by_start.setdefault(u[0], []).append(arm[u].linear - base[u].linear)
    return float(np.mean([np.mean(d) for d in by_start.values()]))


def not_read(read: dict[str, dict[Unit, ReplicateReading]], seeds: list[Unit], x: float, axis: str) -> str:
    """Why ``x`` is not read: how many of ``seeds`` fail, each arm's count by reason, the first failing one in
    numbers; "" when every replicate of both arms has a run that passes ``x``."""
    failing = {u for by_unit in read.values() for u, r in by_unit.items() if r.reason is not None}
    if not failing:
        return ""
    counts = []
    for who, by_unit in read.items():
        by = Counter(r.reason for r in by_unit.values() if r.reason is not None)
        if by:
            counts.append(f"{who} in " + " and ".join(f"{by[code]} ({what})" for code, what in REASONS.items()
                                                      if by[code]))
    who, unit = next((w, u) for w, by_unit in read.items() for u in seeds if by_unit[u].reason is not None)
    return (f"not read at {axis} {x:.3g}: {len(failing)} of {len(seeds)} replicates fail ({', '.join(counts)}); e.g. "
            f"{_example(who, read[who][unit], unit, x, axis)}; a crossing is never extrapolated")


def _example(who: str, r: ReplicateReading, unit: Unit, x: float, axis: str) -> str:
    """One failing replicate in numbers: how far its runs got, or where the first of them that reached x already was
    at its first evaluation."""
    rep = replicate_name(unit)
    if r.reason == "never_reached":
        top = max(d for t in r.trajectories for _, d, _ in t)
        return f"{who}'s runs in {rep} reached {axis} {top:.3g} at the most"
    step, first, _ = min((t[0] for t in r.trajectories if any(d >= x for _, d, _ in t)), key=lambda p: p[1])
    return (f"{who}'s runs in {rep} that reached it were at {axis} {first:.3g} or more by their first evaluation "
            f"after step 0 (step {step})")


def _text(m: MatchedDrift, plan: ComparisonPlan, values: tuple[float, ...]) -> str:
    key, axis, n = plan.block["frontier_key"], m.axis.key, len(m.rows)
    head = (f"Primary contrasts (comparison.primary at comparison.matched, declared before the runs), estimand "
            f"**crossing** (comparison.matched.estimand): each of {', '.join(plan.primary)} against {m.baseline} "
            f"where each run's {axis} first passes {', '.join(f'{x:.3g}' for x in values)}, on {m.metric}. Each run "
            f"is read between its two evaluations after step 0 around that value, its metric and per-prompt scores "
            f"interpolated in log {axis}; per replicate (SFT start and seed) an arm's value is the mean over its runs "
            f"across {key} that pass it. It compares policies part-way through their runs, at whatever {key} reached "
            f"the drift, not the final-point frontier across {key}. The units are the SFT starts, then seeds, then "
            f"prompts. One Holm family of the {n} declared comparison{'s' * (n != 1)} (one that makes no claim counts "
            f"with p 1), alpha {plan.alpha:g}" + (f", equivalence margin ±{plan.margin:g}." if plan.margin is not None
                                                  else ".")
            + f" A replicate in which no run of an arm passes the value makes no claim. comparison.frontier_gap, "
            f"comparison.matched.max_gap and comparison.matched.along bound readings across runs and do not apply: "
            f"each run is read between its own evaluations. Each run's {axis} at its crossing is taken as exact: the "
            f"drift resample re-reads curves of final points and is not applied to a crossing.")
    parts = [head] + [m.verdicts[r.label].sentence(m.baseline) for r in m.rows if r.label in m.verdicts]
    unclaimed = [f"{r.label} ({r.no_claim})" for r in m.rows if r.result is None]
    if unclaimed:
        parts.append("No claim: " + "; ".join(unclaimed) + ".")
    read = [f"{r.label}: " + ", ".join(f"{who} between {lo:.3g} and {hi:.3g} (a factor {hi / lo:.3g} apart)"
                                       for who, (lo, hi) in r.brackets.items())
            + f"; Δ {m.verdicts[r.label].result.point:+.3f} with each chord in log {axis}, {r.other_chord:+.3f} in "
              f"linear {axis}" for r in m.rows if r.brackets and r.label in m.verdicts]
    if read:
        parts.append(f"Where the runs were read (the medians over the runs that pass the value of their {axis} at the "
                     f"two evaluations each is read between), and the point estimate with each chord drawn in linear "
                     f"instead of log {axis}: " + "; ".join(read) + ".")
    return " ".join(parts)
