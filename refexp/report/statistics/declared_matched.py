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
ended; nor is one read across a step on the matched axis wider than ``comparison.matched.max_gap`` (a ratio on a
drift, a difference on retention), or across a gap in the frontier key wider than ``comparison.frontier_gap``
(``reading_rules.py``: the rule the design step shares). A contrast that makes no claim counts every failing
replicate by reason for each arm (``unread.py``); one that is read says where each curve was read and what the
chord in the other scale would give. This is the ``frontier`` estimand (``comparison.matched.estimand``); the
``crossing`` one, each run read where its drift first passes the value, is ``crossing_contrasts.py``'s.
"""

from __future__ import annotations

from typing import Optional

from refexp.record.metric_names import KL_INIT
from refexp.report.reading.comparison_plan import ComparisonPlan
from refexp.report.reading.load import Run
from refexp.report.statistics.crossing_contrasts import declared_crossing
from refexp.report.statistics.drift_resample import x_noise_sentence
from refexp.report.statistics.frontier import (
    MatchedDrift,
    MatchedRow,
    chord_point,
    compare_at,
    curves,
    frontier_gap,
    gap_rule,
    reading_text,
)
from refexp.report.statistics.frontier_key import cut_along_key
from refexp.report.statistics.frontier_points import DRIFT_AXIS, RETENTION_AXIS, Axis, Curves
from refexp.report.statistics.inference import difference_bound, family_verdicts
from refexp.report.statistics.reading_rules import bracket
from refexp.report.statistics.unread import unread


def declared_matched(runs: list[Run], plan: ComparisonPlan) -> Optional[MatchedDrift]:
    """The primary family at the declared matched values; None when the plan declares none (no ``matched.at``,
    no ``frontier_key`` or no primary contrast). ``comparison.matched.estimand: crossing``: each run read where its
    drift first passes the value instead (``crossing_contrasts.py``)."""
    if plan.matched_estimand == "crossing":
        return declared_crossing(runs, plan)
    axis_key, values = plan.matched_at
    if not values or not plan.primary or not (plan.block or {}).get("frontier_key"):
        return None
    axis = (DRIFT_AXIS if axis_key == KL_INIT else RETENTION_AXIS if axis_key == RETENTION_AXIS.key
            else Axis(axis_key, True))  # kl/init_exact: a drift too, in log
    metrics = plan.primary_metrics
    out = MatchedDrift(axis, ", ".join(metrics), plan.baseline, gap=frontier_gap(plan), max_gap=plan.max_gap)
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
                           out.gap, plan.block["frontier_key"], plan.baseline, plan.matched_along, out.max_gap)
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
         gap: float, key: str, baseline: str, along: str = "axis", max_gap: Optional[float] = None) -> MatchedRow:
    """One primary contrast at one declared value (``base``, ``mine``: the baseline's and the arm's curve labels),
    or its reason for making no claim (``unread``: every replicate that ``reading_rules`` cannot read, by reason).
    ``along``: ``comparison.matched.along`` (``key``: each replicate's curve cut to the two runs where its path along
    the key crosses ``x``, ``key_crossing``); ``max_gap``: ``comparison.matched.max_gap``."""
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
    why = unread([("the baseline", base_c), (arm, arm_c)], seeds, x, axis, gap, max_gap, along, key)
    if why:
        return MatchedRow(arm, x, seeds, label, no_claim=why)
    if along == "key":
        cs = cut_along_key(cs, base[0], mine[0], seeds, x)
        arm_c, base_c = cs[mine[0]], cs[base[0]]
    result, resampled = compare_at(arm_c, base_c, seeds, x, axis, metric)
    return MatchedRow(arm, x, seeds, label, result, x_resampled=resampled,
                      brackets={baseline: bracket(base_c, seeds, x), arm: bracket(arm_c, seeds, x)},
                      other_chord=chord_point(arm_c, base_c, seeds, x, not axis.log, metric))


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
            + f" ({gap_rule(m, key)}; never extrapolated); the units are the SFT "
            f"starts, then seeds, then prompts. One Holm family of the {n} declared comparison{'s' * (n != 1)} "
            f"(one that makes no claim counts with p 1), alpha "
            f"{plan.alpha:g}" + (f", equivalence margin ±{plan.margin:g}." if plan.margin is not None else "."))
    parts = [head] + [m.verdicts[r.label].sentence(m.baseline) for r in m.rows if r.label in m.verdicts]
    parts += x_noise_sentence([(r.label, r.x_noise_share) for r in m.rows if r.x_noise_share is not None],
                              m.axis.key)
    unclaimed = [f"{r.label} ({r.no_claim})" for r in m.rows if r.result is None]
    if unclaimed:
        parts.append("No claim: " + "; ".join(unclaimed) + ".")
    read = reading_text(m)
    return " ".join(parts + ([read] if read else []))
