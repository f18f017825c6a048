"""Each arm's frontier across a swept key (``comparison.frontier_key``, e.g. ``algo.beta``) and the arms compared
at matched drift.

A weaker KL term buys accuracy with drift, so two strategies run at one beta differ in both; which one is better
is a question at equal drift. Per replicate (SFT start and seed), an arm's runs across the frontier key give
points (x, accuracy), x its final drift (``kl/init``) or its final ``eval/retention``; the replicate's curve joins
them piecewise-linearly in log x (linearly for retention, a share), sorted by x. Against the baseline arm, at
values of x inside the range both arms' curves cover in every common replicate (``common_range``), each
replicate's interpolated accuracy is a weighted sum of two runs' per-prompt scores, so the paired bootstrap over
starts, seeds and prompts (``metric_scores``) resamples the interpolation itself, paired by start, seed and prompt;
where the runs logged their x per prompt, each replicate resamples the x-values too (``drift_resample``).
The comparisons of one axis form one Holm family.

A matched point is compared only where no curve extrapolates across a gap (``reading_rules.replicate_problem``): in
every replicate, the two runs either curve is interpolated between at that x must lie within
``comparison.matched.max_gap`` of each other on the axis, where this axis is the declared matched one (a ratio on
drift, a difference on retention; none declared: no bound), and have frontier-key values (β) within a factor
``frontier_gap`` of each other (the comparison block's, else ``DEFAULT_FRONTIER_GAP``). Otherwise the row makes no
claim and counts the replicates that fail, by reason for each arm (``unread.py``) -- a straight line across a wide
step is a guess at a curve that bends, not a measurement of it. A compared row keeps where its curves were read
(``reading_rules.bracket``) and its point estimate with the chord in the other scale (``chord_point``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from refexp.record.overrides import swept_settings
from refexp.report.reading.comparison_plan import ComparisonPlan
from refexp.report.reading.load import Run, _get
from refexp.report.statistics.drift_resample import drift_shift, shifted, x_noise_sentence
from refexp.report.statistics.frontier_key import cut_along_key
from refexp.report.statistics.frontier_points import Axis, Curves, Point
from refexp.report.statistics.inference import Verdict, difference_bound, family_verdicts
from refexp.report.statistics.metric_scores import aligned, final_scores, final_value, paired_result
from refexp.report.statistics.paired import BothLevelsResult, Unit
from refexp.report.statistics.reading_rules import bracket
from refexp.report.statistics.unread import unread

MATCHED_FRACTIONS = (1 / 3, 2 / 3)
"""Where in the common range (in log x for drift) the arms are compared: two interior points."""
DEFAULT_FRONTIER_GAP = 2.5
"""The widest ratio of frontier-key values (larger / smaller) between the two runs a curve is interpolated between
at a matched point, when the comparison block declares no ``frontier_gap``: a 1-2-5 grid of β (1, 0.5, 0.2, 0.1)
is dense enough, a β 1 -> 0.2 step is not."""


Settings = tuple[tuple[str, str], ...]


def settings_of(run: Run, arm_key: str, common: frozenset = frozenset()) -> Settings:
    """The run's swept settings other than the arm, the seed, the algorithm/reference choices and the ``common``
    ones (``key=value`` every run of the sweep was given, e.g. ``debug=fast``: they tell no setting apart)."""
    got = swept_settings(run.overrides, drop=("algo", "reference", arm_key))
    return tuple(sorted((k, v) for k, v in got.items() if f"{k}={v}" not in common))


def common_settings(runs: list[Run]) -> frozenset:
    """The ``key=value`` settings every one of ``runs`` has."""
    each = [{f"{k}={v}" for k, v in swept_settings(r.overrides).items()} for r in runs]
    return frozenset(set.intersection(*each)) if each else frozenset()


def curve_label(run: Run, plan: ComparisonPlan, common: frozenset) -> str:
    """The arm, with the swept settings other than the frontier key and the ``common`` ones when it has any (two
    reset intervals swept within one arm are two curves)."""
    key = plan.block["frontier_key"]
    other = [f"{k}={v}" for k, v in settings_of(run, plan.block["arm_key"], common) if k != key]
    return plan.arm(run) + (f" ({', '.join(other)})" if other else "")


def frontier_value(run: Run, key: str) -> Optional[float]:
    """The run's value of ``key`` (its override, else its config), as a number."""
    v = run.override(key)
    v = _get(run.config, key) if v is None else v
    try:
        return float(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def planned_runs(runs: list[Run], plan: ComparisonPlan) -> list[Run]:
    """The completed runs the plan counts, of its arms and seeds."""
    block = plan.block or {}
    return [r for r in runs if r.problem is None and plan.counts(r) and plan.arm(r) in block.get("arms", [])
            and r.seed in block.get("seeds", [])]


def curves(runs: list[Run], plan: ComparisonPlan, axis: Axis, metric: str) -> Curves:
    """Every planned run with a final x (> 0 on a log axis) and a final ``metric``, by arm and (start, seed)."""
    key = plan.block["frontier_key"]
    out: Curves = {}
    planned = planned_runs(runs, plan)
    common = common_settings(planned)
    for r in planned:
        x, y, v = final_value(r, axis.key), final_value(r, metric), frontier_value(r, key)
        if x is None or y is None or v is None or (axis.log and x <= 0):
            continue
        unit = (r.sft_start, r.seed)
        out.setdefault(curve_label(r, plan, common), {}).setdefault(unit, []).append(Point(r, v, x, y))
    for by_seed in out.values():
        for pts in by_seed.values():
            pts.sort(key=lambda p: (p.x, p.value))
    return out


def weights(xs: list[float], x: float, log: bool) -> np.ndarray:
    """Weights [n] over points at ``xs`` (sorted ascending) whose weighted sum is the piecewise-linear curve at
    ``x`` (in log x when ``log``): two neighbours share the weight by distance, the rest get 0. ``x`` must lie
    in [xs[0], xs[-1]]."""
    t = np.log(np.asarray(xs, dtype=float)) if log else np.asarray(xs, dtype=float)
    tx = math.log(x) if log else x
    if not t[0] - 1e-12 <= tx <= t[-1] + 1e-12:
        raise ValueError(f"{x} lies outside the curve's range [{xs[0]}, {xs[-1]}]")
    w = np.zeros(len(xs))
    j = int(np.clip(np.searchsorted(t, tx, side="right") - 1, 0, len(xs) - 1))
    if j == len(xs) - 1 or t[j + 1] == t[j]:
        w[j] = 1.0
        return w
    share = (tx - t[j]) / (t[j + 1] - t[j])
    w[j], w[j + 1] = 1.0 - share, share
    return w


def common_range(a: dict[Unit, list[Point]], b: dict[Unit, list[Point]]
                 ) -> Optional[tuple[float, float, list[Unit]]]:
    """(lo, hi, replicates): the x range every common replicate's curve of both arms covers (each needs 2 points
    or more); None when fewer than 2 replicates have both curves or the range is empty."""
    seeds = sorted(s for s in a if s in b and len(a[s]) >= 2 and len(b[s]) >= 2)
    if len(seeds) < 2:
        return None
    lo = max(min(p.x for p in c[s]) for c in (a, b) for s in seeds)
    hi = min(max(p.x for p in c[s]) for c in (a, b) for s in seeds)
    return (lo, hi, seeds) if lo < hi else None


def matched_values(lo: float, hi: float, log: bool) -> list[float]:
    """The x values compared: ``MATCHED_FRACTIONS`` of the way from lo to hi (geometrically on a log axis)."""
    if log:
        return [math.exp(math.log(lo) + f * (math.log(hi) - math.log(lo))) for f in MATCHED_FRACTIONS]
    return [lo + f * (hi - lo) for f in MATCHED_FRACTIONS]


def frontier_gap(plan: ComparisonPlan) -> float:
    """The comparison block's ``frontier_gap`` (a number > 1), else ``DEFAULT_FRONTIER_GAP``; read defensively, since
    blocks written before the field lack it."""
    value = (plan.block or {}).get("frontier_gap")
    if value is None:
        return DEFAULT_FRONTIER_GAP
    try:
        gap = float(value)
    except (TypeError, ValueError):
        gap = float("nan")
    if not gap > 1:
        raise ValueError(f"comparison.frontier_gap is {value!r}: it must be a number > 1 (the widest ratio of "
                         f"frontier-key values, e.g. beta, between two runs a matched point lies between)")
    return gap


def interpolated(pts: list[Point], x: float, log: bool, metric: str) -> tuple[float, Optional[np.ndarray], list]:
    """(the curve's accuracy at x, the interpolated per-prompt scores over ``ids`` or None, ``ids``)."""
    w = weights([p.x for p in pts], x, log)
    value = float(np.dot(w, [p.y for p in pts]))
    got = aligned([final_scores(p.run, metric) for p in pts])
    if got is None:
        return value, None, []
    ids, scores = got
    return value, np.sum([wi * s for wi, s in zip(w, scores)], axis=0), ids


def _seed_pair(a: list[Point], b: list[Point], x: float, log: bool, metric: str):
    """(arm's scores, baseline's scores, arm - baseline, the prompt ids of the scores) at x over the prompts both
    curves' runs scored."""
    va, sa, ia = interpolated(a, x, log, metric)
    vb, sb, ib = interpolated(b, x, log, metric)
    if sa is None or sb is None:
        return None, None, va - vb, []
    pos_b = {i: k for k, i in enumerate(ib)}
    common = [(k, pos_b[i]) for k, i in enumerate(ia) if i in pos_b]
    if not common:
        return None, None, va - vb, []
    sa, sb = sa[[k for k, _ in common]], sb[[k for _, k in common]]
    return sa, sb, float(sa.mean() - sb.mean()), [ia[k] for k, _ in common]


def chord_point(arm: dict[Unit, list[Point]], base: dict[Unit, list[Point]], seeds: list[Unit], x: float,
                log: bool, metric: str) -> Optional[float]:
    """arm - baseline at x over ``seeds`` with each replicate's chord drawn in log x (``log``) or linear x: the point
    estimate alone (the mean over SFT starts of the mean over their seeds, as the bootstrap's point), no bootstrap.
    Drawn in the other scale than the axis's, it shows how much the chord's shape moves a contrast. None where a
    log chord meets an x <= 0."""
    if log and any(p.x <= 0 for s in seeds for c in (arm, base) for p in c[s]):
        return None
    by_start: dict[str, list[float]] = {}
    for s in seeds:
        by_start.setdefault(s[0], []).append(_seed_pair(arm[s], base[s], x, log, metric)[2])
    return float(np.mean([np.mean(d) for d in by_start.values()]))


def axis_max_gap(plan: ComparisonPlan, axis: Axis) -> Optional[float]:
    """``comparison.matched.max_gap`` where ``axis`` is the declared matched axis (``comparison.matched.axis``), else
    None: a bound declared on one axis says nothing of steps on another."""
    return plan.max_gap if axis.key == plan.matched_at[0] else None


@dataclass
class MatchedRow:
    """One arm against the baseline at one matched x."""

    arm: str
    x: Optional[float]
    seeds: list[Unit]
    """The (SFT start, seed) replicates compared."""
    label: str
    result: object = None
    no_claim: str = ""
    x_resampled: bool = False
    """Whether the bootstrap resampled every run's x too (its per-prompt contributions were logged)."""
    metric: str = ""
    """The metric compared, where a table holds several (the declared primary contrasts); "": the table's."""
    brackets: dict = field(default_factory=dict)
    """Arm (the baseline's and the compared one's) -> (lower x, upper x): the medians over the replicates of the
    final x of the two runs its curve is interpolated between (the declared primary contrasts;
    ``reading_rules.bracket``)."""
    other_chord: Optional[float] = None
    """The point estimate with each replicate's chord drawn in the other scale (linear x on a log axis, log x on a
    linear one; ``chord_point``): beside the reported one, how much the chord's shape moves it."""

    @property
    def x_noise_share(self) -> Optional[float]:
        """The share of its bootstrap's variance due to the x-values' own prompt noise (``drift_resample``); None
        where x was taken as exact or nothing was compared."""
        return getattr(self.result, "x_noise_share", None) if self.x_resampled else None


@dataclass
class MatchedDrift:
    """The matched table of one axis: its rows (with results), their Holm family's verdicts, and the text."""

    axis: Axis
    metric: str
    baseline: str
    rows: list[MatchedRow] = field(default_factory=list)
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    text: str = ""
    gap: float = DEFAULT_FRONTIER_GAP
    """The widest ratio of frontier-key values a matched point may be interpolated across (``frontier_gap``)."""
    max_gap: Optional[float] = None
    """The widest step on the axis between the two runs a curve is read between (``comparison.matched.max_gap``
    where this axis is the declared matched one; ``axis_max_gap``); None: no bound on the axis."""
    max_gap_axis: str = ""
    """The declared matched axis ``comparison.matched.max_gap`` bounds, where that is another axis than this one
    (its text says this table keeps only the frontier-key rule); "": none declared, or this axis."""
    estimand: str = "frontier"
    """What the rows estimate (``comparison.matched.estimand``): ``frontier``, each curve of final points read at x;
    ``crossing``, each run read where its drift first passes x (``crossing_contrasts.py``)."""


def matched(runs: list[Run], plan: ComparisonPlan, axis: Axis, metric: str) -> Optional[MatchedDrift]:
    """Every arm against the baseline at ``MATCHED_FRACTIONS`` of their common x range; None when the plan
    declares no frontier or no run has the axis."""
    if not plan.block or not plan.block.get("frontier_key"):
        return None
    cs = curves(runs, plan, axis, metric)
    if not cs:
        return None
    gap, max_gap = frontier_gap(plan), axis_max_gap(plan, axis)
    out = MatchedDrift(axis, metric, plan.baseline, gap=gap, max_gap=max_gap,
                       max_gap_axis=plan.matched_at[0] if plan.max_gap is not None and max_gap is None else "")
    arm_of = {label: plan.arm(next(iter(by_seed.values()))[0].run) for label, by_seed in cs.items()}
    bases = [label for label, arm in arm_of.items() if arm == plan.baseline]
    arms = list(plan.block["arms"])
    for arm in arms:
        if arm != plan.baseline and arm not in arm_of.values():
            out.rows.append(MatchedRow(arm, None, [], arm, no_claim=f"no completed run with {axis.key}"))
    for label in sorted(cs, key=lambda c: arms.index(arm_of[c])):
        if label in bases:
            continue
        if len(bases) != 1:
            why = "no baseline curve" if not bases else f"the baseline has {len(bases)} curves ({', '.join(bases)})"
            out.rows.append(MatchedRow(label, None, [], label, no_claim=why))
            continue
        base = bases[0]
        rng = common_range(cs[label], cs[base])
        if rng is None:
            out.rows.append(MatchedRow(label, None, [], label, no_claim=f"no {axis.key} range that both curves "
                                                                        f"cover in 2 or more common replicates"))
            continue
        lo, hi, seeds = rng
        key = plan.block["frontier_key"]
        for x in matched_values(lo, hi, axis.log):
            why = unread([("the baseline", cs[base]), (label, cs[label])], seeds, x, axis, gap, max_gap,
                         plan.matched_along, key)
            if why:
                out.rows.append(MatchedRow(label, x, seeds, f"{label} at {axis.key} {x:.3g}", no_claim=why))
                continue
            at = cut_along_key(cs, base, label, seeds, x) if plan.matched_along == "key" else cs
            result, resampled = compare_at(at[label], at[base], seeds, x, axis, metric)
            read = {base: bracket(at[base], seeds, x), label: bracket(at[label], seeds, x)}
            out.rows.append(MatchedRow(label, x, seeds, f"{label} at {axis.key} {x:.3g}", result,
                                       x_resampled=resampled, brackets=read,
                                       other_chord=chord_point(at[label], at[base], seeds, x, not axis.log, metric)))
    out.verdicts = family_verdicts({r.label: r.result for r in out.rows if r.result is not None}, alpha=plan.alpha,
                                   margin=plan.margin, bound=difference_bound(metric))
    out.text = _text(out, plan.alpha)
    return out


def compare_at(arm: dict[Unit, list[Point]], base: dict[Unit, list[Point]], seeds: list[Unit], x: float,
               axis: Axis, metric: str) -> tuple[object, bool]:
    """(the paired result of arm - baseline at x over ``seeds``, whether the bootstrap resampled every run's x
    too): each replicate's curves interpolated at x, paired by start, seed and prompt (``paired_result``); where the
    runs logged x per prompt, the x-values' own sampling error shifts the bootstrap (``drift_resample.py``)."""
    per_seed = {s: _seed_pair(arm[s], base[s], x, axis.log, metric) for s in seeds}
    result = paired_result(per_seed)
    if isinstance(result, BothLevelsResult):
        shift = drift_shift(arm, base, seeds, x, axis.log, axis.key, result.boot.n_boot)
        if shift is not None:
            return BothLevelsResult(shifted(result.boot, shift), result.seeds), True
    return result, False


def gap_rule(m: MatchedDrift, key: str = "the frontier key") -> str:
    """The rule a point is read under, as a clause: within a factor ``m.gap`` in ``key``, and within
    ``m.max_gap`` on the axis where it is bounded there; saying so where the bound is another axis's."""
    rule = f"within a factor {m.gap:g} in {key}"
    if m.max_gap is not None:
        return (f"{rule} and within {'a factor ' if m.axis.log else ''}{m.max_gap:g} on {m.axis.key} "
                f"(comparison.matched.max_gap)")
    if m.max_gap_axis:
        return (f"{rule} only: comparison.matched.max_gap bounds the step on {m.max_gap_axis}, not on "
                f"{m.axis.key}")
    return rule


def reading_text(m: MatchedDrift) -> str:
    """Where each compared row's curves were read (``MatchedRow.brackets``: the medians over the replicates of the
    two runs' x, and the factor or difference between them) and its point estimate with the chord in the other scale
    beside the reported one; "" when no row was compared."""
    rows = [r for r in m.rows if r.brackets and r.label in m.verdicts]
    if not rows:
        return ""
    scale, other = ("log", "linear") if m.axis.log else ("linear", "log")

    def step(lo: float, hi: float) -> str:
        if not m.axis.log:
            return f" ({hi - lo:.3g} apart)"
        return f" (a factor {hi / lo:.3g} apart)" if lo > 0 else ""

    def chord(r: MatchedRow) -> str:
        got = m.verdicts[r.label].result.point
        alt = "not drawn (an x <= 0)" if r.other_chord is None else f"{r.other_chord:+.3f}"
        return f"Δ {got:+.3f} with the chord in {scale} {m.axis.key}, {alt} in {other} {m.axis.key}"

    read = [f"{r.label}: " + ", ".join(f"{who} between {lo:.3g} and {hi:.3g}{step(lo, hi)}"
                                       for who, (lo, hi) in r.brackets.items()) + f"; {chord(r)}" for r in rows]
    return (f"Where each curve was read (the medians over the replicates of the final {m.axis.key} of the two runs "
            f"it is interpolated between), and the point estimate with each chord drawn in {other} instead of "
            f"{scale} {m.axis.key}: " + "; ".join(read) + ". The interpolated value is a chord across that gap: "
            "where a curve bends between its two runs (a gold reward that peaks and then falls with drift), the "
            "chord misplaces it, the more the wider the gap; the two chords' difference shows how much the chord's "
            "shape alone moves the estimate.")


def _text(m: MatchedDrift, alpha: float) -> str:
    n = len(m.verdicts)
    head = (f"{m.metric} at matched {m.axis.key}, each arm against {m.baseline} at two values inside the range "
            f"both cover in every common replicate (SFT start and seed; each one's curve across {m.axis.key} "
            f"interpolated {'in log ' + m.axis.key if m.axis.log else 'linearly'}; a point is compared only where, "
            f"in every replicate, each curve's two runs around it are {gap_rule(m)}). "
            f"Family: {n} comparison{'s' * (n != 1)}, Holm-adjusted, alpha {alpha:g}.")
    compared = [r for r in m.rows if r.label in m.verdicts]
    if compared:
        n_x = sum(r.x_resampled for r in compared)
        head += (f" The bootstrap resamples each run's {m.axis.key} prompt by prompt too." if n_x == len(compared)
                 else f" {m.axis.key} taken as exact (no per-prompt {m.axis.key} logged)." if n_x == 0 else
                 f" {m.axis.key} resampled prompt by prompt in {n_x} of {len(compared)} comparisons (the others' "
                 f"runs logged no per-prompt {m.axis.key}: taken as exact).")
    parts = [head] + [m.verdicts[r.label].sentence(m.baseline) for r in compared]
    parts += x_noise_sentence([(r.label, r.x_noise_share) for r in compared if r.x_noise_share is not None],
                              m.axis.key)
    unclaimed = [f"{r.label} ({r.no_claim or 'fewer than 2 replicates'})" for r in m.rows if r.result is None]
    if unclaimed:
        parts.append("No claim: " + "; ".join(unclaimed) + ".")
    read = reading_text(m)
    return " ".join(parts + ([read] if read else []))
