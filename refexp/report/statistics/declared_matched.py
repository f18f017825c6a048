"""The primary contrasts at matched drift declared before the runs (``comparison.matched``).

``frontier.matched`` compares every arm with the baseline at points it picks from the data (1/3 and 2/3 of the range
both cover), which suits a secondary table but not a pre-registered claim: where a contrast is tested must not
depend on what the runs did. Here each arm of ``comparison.primary`` is compared with the baseline's frontier at
each value of ``comparison.matched.axis`` listed in ``comparison.matched.at``, on each primary metric, and these
comparisons are the primary family (Holm over them alone, the equivalence margin's two one-sided tests).

Per replicate (SFT start, seed) each arm's curve across ``comparison.frontier_key`` is interpolated at the value
(``frontier.compare_at``: piecewise-linear in log kl/init, the runs' per-prompt scores weighted, the bootstrap over
starts, seeds and prompts with the Student t over the starts' mean differences). A value outside the range a
replicate's runs of either arm reached is never extrapolated: the contrast makes no claim and says where the runs
ended; nor is one read across a gap in the frontier key wider than ``comparison.frontier_gap``.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from refexp.record.metric_names import KL_INIT
from refexp.report.reading.comparison_plan import ComparisonPlan
from refexp.report.reading.load import Run
from refexp.report.statistics.drift_resample import x_noise_sentence
from refexp.report.statistics.frontier import MatchedDrift, MatchedRow, compare_at, curves, frontier_gap, not_matched
from refexp.report.statistics.frontier_key import cut_along_key
from refexp.report.statistics.frontier_points import DRIFT_AXIS, RETENTION_AXIS, Axis, Curves
from refexp.report.statistics.inference import difference_bound, family_verdicts
from refexp.report.statistics.paired import Unit


def declared_matched(runs: list[Run], plan: ComparisonPlan) -> Optional[MatchedDrift]:
    """The primary family at the declared matched values; None when the plan declares none (no ``matched.at``,
    no ``frontier_key`` or no primary contrast)."""
    axis_key, values = plan.matched_at
    if not values or not plan.primary or not (plan.block or {}).get("frontier_key"):
        return None
    axis = (DRIFT_AXIS if axis_key == KL_INIT else RETENTION_AXIS if axis_key == RETENTION_AXIS.key
            else Axis(axis_key, True))  # kl/init_exact: a drift too, in log
    metrics = plan.primary_metrics
    out = MatchedDrift(axis, ", ".join(metrics), plan.baseline, gap=frontier_gap(plan))
    results = {}
    for metric in metrics:
        cs = curves(runs, plan, axis, metric)
        by_arm: dict[str, list[str]] = {}  # arm -> its curves' labels (one, unless a setting is swept within it)
        for curve, by_seed in cs.items():
            by_arm.setdefault(plan.arm(next(iter(by_seed.values()))[0].run), []).append(curve)
        for arm in plan.primary:
            for x in values:
                label = f"{arm} at {axis.key} {x:.3g}" + (f" [{metric}]" if len(metrics) > 1 else "")
                row = _row(cs, by_arm.get(plan.baseline, []), by_arm.get(arm, []), arm, x, axis, metric, label,
                           out.gap, plan.block["frontier_key"], plan.baseline, plan.matched_along)
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


def _row(cs: Curves, base: list[str], mine: list[str], arm: str, x: float, axis: Axis, metric: str, label: str,
         gap: float, key: str, baseline: str, along: str = "axis") -> MatchedRow:
    """One primary contrast at one declared value (``base``, ``mine``: the baseline's and the arm's curve labels),
    or its reason for making no claim. ``along``: ``comparison.matched.along`` (``key``: each replicate's curve cut
    to the two runs where its path along the key crosses ``x``, ``key_crossing``)."""
    for who, labels in (("the baseline", base), (arm, mine)):
        if len(labels) != 1:
            what = "no curve" if not labels else f"{len(labels)} curves ({', '.join(labels)})"
            return MatchedRow(arm, x, [], label, no_claim=f"{who} has {what} across {key}: a declared contrast needs "
                                                          f"one, of completed runs with a final {axis.key}")
    arm_c, base_c = cs[mine[0]], cs[base[0]]
    seeds = sorted(s for s in arm_c if s in base_c and len(arm_c[s]) >= 2 and len(base_c[s]) >= 2)
    if len(seeds) < 2:
        return MatchedRow(arm, x, seeds, label, no_claim=f"fewer than 2 replicates (SFT start, seed) in which "
                                                         f"both {arm} and the baseline have 2 or more runs")
    if along == "key":
        cs, why = cut_along_key(cs, base[0], mine[0], seeds, x, axis, key)
        if why:
            return MatchedRow(arm, x, seeds, label, no_claim=why)
        arm_c, base_c = cs[mine[0]], cs[base[0]]
    why = (_outside(arm_c, base_c, arm, seeds, x, axis)
           or not_matched(cs, base[0], mine[0], seeds, x, axis.log, gap, key))
    if why:
        return MatchedRow(arm, x, seeds, label, no_claim=why)
    result, resampled = compare_at(arm_c, base_c, seeds, x, axis, metric)
    return MatchedRow(arm, x, seeds, label, result, x_resampled=resampled,
                      brackets={baseline: bracket(base_c, seeds, x), arm: bracket(arm_c, seeds, x)})


def bracket(curve, seeds: list[Unit], x: float) -> tuple[float, float]:
    """(lower, upper): over ``seeds``, the medians of the final x of the curve's runs nearest ``x`` from below and
    from above, the two its value at ``x`` is interpolated between. Interpolation draws a chord across that gap: where
    the curve bends between the two runs, the chord misplaces it, the more the wider the gap."""
    lows = [max(p.x for p in curve[s] if p.x <= x * (1 + 1e-9)) for s in seeds]
    highs = [min(p.x for p in curve[s] if p.x >= x * (1 - 1e-9)) for s in seeds]
    return float(np.median(lows)), float(np.median(highs))


def _outside(arm_c, base_c, arm: str, seeds: list[Unit], x: float, axis: Axis) -> str:
    """Why ``x`` lies outside what the runs of either curve reached: in how many replicates, and the first one's
    range; "" when every replicate's curves cover it."""
    parts = []
    for who, c in (("the baseline", base_c), (arm, arm_c)):
        out = [(s, min(p.x for p in c[s]), max(p.x for p in c[s])) for s in seeds]
        out = [(s, lo, hi) for s, lo, hi in out if not lo * (1 - 1e-9) <= x <= hi * (1 + 1e-9)]
        if out:
            (start, seed), lo, hi = out[0]
            first = f"{f'SFT start {start}, ' if start else ''}seed {seed} (from {lo:.3g} to {hi:.3g})"
            parts.append(f"the {axis.key} {who}'s runs reached in replicate {first}" if len(seeds) == 1 else
                         f"the {axis.key} {who}'s runs reached in {len(out)} of {len(seeds)} replicates (the first: "
                         f"{first})")
    if not parts:
        return ""
    return (f"not matched: the declared {axis.key} {x:.3g} lies outside {' and '.join(parts)}; a matched value is "
            f"never extrapolated")


def _text(m: MatchedDrift, plan: ComparisonPlan, values: tuple[float, ...]) -> str:
    key = plan.block["frontier_key"]
    n = len(m.rows)
    head = (f"Primary contrasts (comparison.primary at comparison.matched, declared before the runs): each of "
            f"{', '.join(plan.primary)} against {m.baseline}'s frontier across {key} at {m.axis.key} "
            f"{', '.join(f'{x:.3g}' for x in values)}, on {m.metric}. Per replicate (SFT start and seed) each arm's "
            f"curve is interpolated {'in log ' + m.axis.key if m.axis.log else 'linearly'} between its two runs "
            + ("around that value" if plan.matched_along == "axis" else
               f"neighbouring on the {key} grid whose {m.axis.key} straddle that value (comparison.matched.along: "
               f"key)")
            + f" (within a factor {m.gap:g} in {key}; never extrapolated); the units are the SFT "
            f"starts, then seeds, then prompts. One Holm family of the {n} declared comparison{'s' * (n != 1)} "
            f"(one that makes no claim counts with p 1), alpha "
            f"{plan.alpha:g}" + (f", equivalence margin ±{plan.margin:g}." if plan.margin is not None else "."))
    parts = [head] + [m.verdicts[r.label].sentence(m.baseline) for r in m.rows if r.label in m.verdicts]
    parts += x_noise_sentence([(r.label, r.x_noise_share) for r in m.rows if r.x_noise_share is not None],
                              m.axis.key)
    unclaimed = [f"{r.label} ({r.no_claim})" for r in m.rows if r.result is None]
    if unclaimed:
        parts.append("No claim: " + "; ".join(unclaimed) + ".")
    read = [f"{r.label}: " + ", ".join(f"{who} between {lo:.3g} and {hi:.3g}"
                                       + (f" (a factor {hi / lo:.3g} apart)" if m.axis.log and lo > 0 else "")
                                       for who, (lo, hi) in r.brackets.items()) for r in m.rows if r.brackets]
    if read:
        parts.append(f"Where each curve was read (the medians over the replicates of the final {m.axis.key} of the "
                     "two runs it is interpolated between): " + "; ".join(read) + ". The interpolated value is a "
                     "chord across that gap: where a curve bends between its two runs (a gold reward that peaks and "
                     "then falls with drift), the chord misplaces it, the more the wider the gap.")
    return " ".join(parts)
