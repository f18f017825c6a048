"""The comparison table of one algorithm in numbers: a row per group, the target, the paired comparisons
against the baseline and their verdicts (``AlgoTable``, what summary.json holds).

``refexp/report/writing/table.py`` turns these numbers into the strings every output prints, and
``refexp/report/sections/comparison.py`` writes them into the report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Optional

from refexp.report.reading.comparison_plan import DEFAULT_METRIC, PRIMARY_ENDPOINTS, ComparisonPlan
from refexp.report.reading.group import Group
from refexp.report.reading.load import Run
from refexp.report.reading.reduce import COLUMNS, Column, at_step_prefix, start_accuracy, steps_to_target
from refexp.report.statistics.inference import Verdict, difference_bound
from refexp.report.statistics.paired import Comparison, Endpoint, compare, final_step, judge, step_at, verdict_text
from refexp.report.statistics.stats import Estimate, mean_ci, replicate_ci, with_evaluation_noise

HEADLINE_KEYS = ("acc_final", "heldout_pref_final")
"""The number a verdict is about under the default ``comparison.metric`` (``eval/accuracy``): final held-out task
accuracy, else (``task=preference``) final held-out preference accuracy. Another declared metric's final value is
the headline itself (``headline_column``)."""

DEFAULT_TARGET_MARGIN = 0.05
"""The default target when no group gained: the best group's mean start (SFT) accuracy + this, capped at 1."""


def column_estimate(column: Column, runs: list[Run]) -> Optional[Estimate]:
    """Mean ± 95% CI of ``column`` over ``runs`` (over their SFT starts' means when they come from several:
    ``stats.replicate_ci``); an accuracy column's interval also carries the binomial noise of the held-out prompts
    every run was measured on (when they all say how many)."""
    est = replicate_ci((r.sft_start, column.per_run(r)) for r in runs)
    prompts = {r.eval_prompts for r in runs} - {None}
    return with_evaluation_noise(est, next(iter(prompts))) if column.binomial and len(prompts) == 1 else est



@dataclass
class ToTarget:
    """Steps to reach the target accuracy: the estimate is over the seeds that reached it."""

    reached: int
    n: int
    estimate: Optional[Estimate]


@dataclass
class Row:
    group: Group
    cells: dict[str, Optional[Estimate]]
    to_target: Optional[ToTarget]
    paired: dict[str, Comparison] = field(default_factory=dict)
    """endpoint key -> this group's comparison with the baseline (empty for the baseline itself and for groups
    outside the comparison)."""

    @property
    def n_completed(self) -> int:
        return len(self.group.completed)

    @property
    def seeds(self) -> list:
        return [r.seed for r in self.group.completed]


@dataclass
class AlgoTable:
    algo: str
    target: Optional[float]
    target_note: str
    columns: list[Column] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    baseline: Optional[str] = None
    """The label of the group paired differences are taken against (None: the algorithm has no such group)."""
    headline: Optional[Column] = None
    endpoints: list[Endpoint] = field(default_factory=list)
    """What the verdicts are about: the headline's final value (``comparison.metric``'s), the other held-out
    metrics' final values, then the headline metric at each ``--at-steps`` step."""
    verdicts: dict[str, dict[str, Verdict]] = field(default_factory=dict)
    """endpoint key -> group label -> its verdict in its family (``roles``)."""
    roles: dict[str, dict[str, str]] = field(default_factory=dict)
    """endpoint key -> group label -> "primary" (a declared primary contrast on a primary metric: one Holm family
    over all of them), "secondary" (a declared block's other comparisons: a Holm family per endpoint, no claim in
    the report's summary) or "exploratory" (no declared block)."""
    verdict: str = ""
    displaced: list[Row] = field(default_factory=list)
    """The groups whose chosen completions ended less likely than at the start (likelihood displacement,
    ``displaced_rows``): what the report flags."""


def default_target(groups: list[Group]) -> tuple[Optional[float], str]:
    """Halfway from the start accuracy (the best group's mean at step 0) to the best group's mean final
    accuracy; the start + ``DEFAULT_TARGET_MARGIN`` (capped at 1) when no group gained.

    Every strategy starts from the same SFT checkpoint, so this asks "which strategy gets half of the
    best gain first". A fixed margin above the start is often reached at the first evaluation by every
    group, which then reads "one eval interval ± 0" everywhere and separates nothing.
    """
    from refexp.report.reading.reduce import ACC, last

    starts, finals = [], []
    for g in groups:
        start = mean_ci(start_accuracy(r) for r in g.completed)
        final = mean_ci(last(r, ACC) for r in g.completed)
        if start is not None:
            starts.append(start.mean)
        if final is not None:
            finals.append(final.mean)
    if not starts:
        return None, "no eval/accuracy logged"
    start = max(starts)
    best = max(finals, default=start)
    if best > start:
        target = start + 0.5 * (best - start)
        return target, f"default: halfway from the start accuracy {start:.3f} to the best final {best:.3f}"
    target = min(1.0, start + DEFAULT_TARGET_MARGIN)
    return target, f"default: no group gained; start accuracy {start:.3f} + {DEFAULT_TARGET_MARGIN}"


def summarize(algo: str, groups: list[Group], target: Optional[float] = None, plan: Optional[ComparisonPlan] = None,
              extra_columns: tuple[Column, ...] = (), conditional: bool = False) -> AlgoTable:
    """Mean ± 95% CI across the completed seeds of every group, for every column with data, and the
    paired differences against the ``plan``'s baseline group with their verdicts (none without a plan);
    ``conditional`` (a table of one SFT start's runs): no comparison is primary there, every one is secondary."""
    note = "--target"
    if target is None:
        target, note = default_target(groups)
    rows = []
    for g in groups:
        cells = {c.key: column_estimate(c, g.completed) for c in (*COLUMNS, *extra_columns)}
        to_target = None
        if target is not None:
            per_run = [(r.sft_start, steps_to_target(r, target)) for r in g.completed]
            per_run = [(start, s) for start, s in per_run if s is not None]
            if per_run:
                reached = [(start, s) for start, s in per_run if math.isfinite(s)]
                to_target = ToTarget(len(reached), len(per_run), replicate_ci(reached))
        rows.append(Row(g, cells, to_target))
    columns = [c for c in (*COLUMNS, *extra_columns) if any(row.cells[c.key] is not None for row in rows)]
    table = AlgoTable(algo, target, note, columns, rows)
    _pair_against_baseline(table, groups, plan or ComparisonPlan(None, None), extra_columns, conditional)
    table.displaced = displaced_rows(rows)
    return table


def displaced_rows(rows: list[Row]) -> list[Row]:
    """Likelihood displacement (Pal et al. 2024; Razin et al. 2024): the rows whose chosen completions ended
    less likely than at the start (``chosen_delta``), with the 95% interval below 0 (one seed: without an interval)."""
    out = []
    for row in rows:
        est = row.cells.get("chosen_delta")
        if est is None or est.mean >= 0 or (est.half_width is not None and est.mean + est.half_width >= 0):
            continue
        out.append(row)
    return out


def headline_column(columns: list[Column], plan: ComparisonPlan) -> tuple[Optional[Column], str]:
    """(the column the verdicts lead with, why there is none): the final value of the plan's ``comparison.metric``
    (``eval/gold``: ``gold_final``); under the default metric the final accuracy, else (``task=preference``) the final
    held-out preference accuracy. None when the table has no such column (the runs did not log the metric)."""
    keys = HEADLINE_KEYS if plan.metric == DEFAULT_METRIC else (PRIMARY_ENDPOINTS[plan.metric],)
    column = next((c for c in columns if c.key in keys), None)
    return column, "" if column is not None else f"no run logged {plan.metric} (comparison.metric): no verdict"


def endpoints(headline: Column, extra_columns: tuple[Column, ...], columns: tuple[Column, ...] = (),
              metric: str = DEFAULT_METRIC) -> list[Endpoint]:
    """The headline's final value (of ``metric``, the plan's ``comparison.metric``), the final value of every other
    held-out metric with per-prompt outcomes (``PRIMARY_ENDPOINTS``: accuracy, retention, gold) that ``columns``, the
    table's, hold, each a family of its own, and the headline metric at each ``extra_columns``' at-step column's step
    S (``acc@S``, ``gold@S``)."""
    has_outcomes = headline.key in PRIMARY_ENDPOINTS.values()  # heldout_pref_final has none: seed-only
    out = [Endpoint(headline.key, headline.header, headline.doc_name, headline.per_run,
                    (lambda r: final_step(r, metric)) if has_outcomes else (lambda r: None), metric=metric)]
    for other, key in PRIMARY_ENDPOINTS.items():
        col = next((c for c in columns if c.key == key), None)
        if col is not None and key != headline.key:
            out.append(Endpoint(col.key, col.header, col.doc_name, col.per_run,
                                lambda r, other=other: final_step(r, other), metric=other))
    prefix = f"{at_step_prefix(metric)}_at_"
    for c in extra_columns:
        if c.key.startswith(prefix):
            s = int(c.key[len(prefix):])
            out.append(Endpoint(c.key, c.header, c.doc_name, c.per_run,
                                lambda r, s=s: step_at(r, s, metric), metric=metric))
    return out


def find_baseline(groups: list[Group], plan: ComparisonPlan) -> tuple[Optional[Group], str]:
    """The one group the plan names as baseline, else None and why (a plan without one, none found, several
    match: the reader names one with --baseline)."""
    if plan.baseline is None:
        return None, ("no comparison: this sweep declares no comparison block and no baseline was named "
                      "(refexp-report SWEEP --baseline NAME)")
    exact = [g for g in groups if not plan.declared and g.label == plan.baseline]
    matches = exact or [g for g in groups if plan.is_baseline(g.runs, g.label)]
    if len(matches) == 1:
        return matches[0], ""
    key = (plan.block or {}).get("frontier_key") if plan.declared else None
    tuned = plan.declared and bool(((plan.block or {}).get("select") or {}).get("metric"))
    if key and matches:
        best = " and each at its best setting" if tuned else ""  # the selection section exists only when declared
        return None, (f"the baseline arm {plan.baseline} has {len(matches)} groups, one per {key}: the arms are "
                      f"compared at matched drift{best} (below), not group by group")
    if tuned and matches:
        return None, (f"the baseline arm {plan.baseline} has {len(matches)} groups, one per setting it was tuned "
                      f"over: the arms are compared each at its best setting (below), not group by group")
    if not matches:
        return None, f"no {plan.baseline!r} group to pair against (--baseline names a group label or a swept variant)"
    return None, (f"--baseline {plan.baseline} matches {len(matches)} groups ({', '.join(g.label for g in matches)}): "
                  f"name one by its label")


def in_comparison(group: Group, plan: ComparisonPlan) -> bool:
    """Whether a group takes part in the verdict: any group of an exploratory report; with a declared block,
    a declared arm (or any, with ``--allow-mixed``)."""
    return not plan.declared or plan.allow_mixed or any(plan.arm(r) in plan.block["arms"] for r in group.runs)


def _role(row: Row, ep: Endpoint, plan: ComparisonPlan, conditional: bool = False) -> str:
    """The row's role on ``ep``: primary only for a declared primary arm on the final value of a primary metric,
    in a table of all the counted runs (not ``conditional`` on one SFT start)."""
    arm = next((plan.arm(r) for r in row.group.runs if plan.arm(r) is not None), None)
    role = plan.role(arm)
    primary_keys = {PRIMARY_ENDPOINTS.get(m) for m in plan.primary_metrics}
    return "secondary" if role == "primary" and (conditional or ep.key not in primary_keys) else role


FAMILY_WORDS = {
    "primary": ("Primary contrasts (comparison.primary: {arms}; one Holm family over them and the primary metrics "
                "{metrics}, the only comparisons the report's summary claims anything of)."),
    "secondary": ("Secondary: not a declared primary contrast (comparison.primary: {arms}); Holm over this "
                  "endpoint's secondary comparisons alone; no claim in the report's summary."),
    "exploratory": "",
}
"""The sentence that opens a family's paragraph, naming what kind of comparison it is."""


def _pair_against_baseline(table: AlgoTable, groups: list[Group], plan: ComparisonPlan,
                           extra_columns: tuple[Column, ...], conditional: bool = False) -> None:
    """Fill each row's ``paired``, the table's ``verdicts``, ``roles`` and its ``verdict`` paragraphs: the primary
    contrasts first, as one Holm family across the primary metrics, then each endpoint's secondary (or, without a
    declared block, exploratory) comparisons as a family of their own."""
    table.headline, missing = headline_column(table.columns, plan)
    if table.headline is None:
        table.verdict = f"{table.algo.upper()}: {missing}." if plan.declared else ""
        return
    base, why = find_baseline(groups, plan)
    if base is None:
        table.verdict = f"{table.algo.upper()}: {why}."
        return
    table.baseline = base.label
    table.endpoints = endpoints(table.headline, extra_columns, tuple(table.columns), plan.metric)
    others = [row for row in table.rows if row.group is not base and in_comparison(row.group, plan)]
    families: dict[str, list[tuple[Endpoint, Row, Comparison]]] = {}
    for ep in table.endpoints:
        table.roles[ep.key], table.verdicts[ep.key] = {}, {}
        for row in others:
            row.paired[ep.key] = c = compare(row.group, base, ep, plan.counts)
            role = table.roles[ep.key][row.group.label] = _role(row, ep, plan, conditional)
            families.setdefault(role if role == "primary" else f"{role}:{ep.key}", []).append((ep, row, c))

    words = {"arms": ", ".join(plan.primary) or "none declared", "metrics": ", ".join(plan.primary_metrics)}
    paragraphs = []
    for name, members in sorted(families.items(), key=lambda kv: kv[0] != "primary"):  # the primary family first
        role = name.split(":")[0]
        eps = list(dict.fromkeys(ep.key for ep, _, _ in members))
        # a family over several endpoints names each member by its endpoint too, so its Holm labels are distinct
        named = [replace(c, label=c.label if len(eps) == 1 else f"{c.label} [{ep.header}]") for ep, _, c in members]
        bounds = {difference_bound(ep.metric) for ep, _, _ in members}  # the metrics' range, where they share one
        verdicts = judge(named, plan.alpha, plan.margin, bounds.pop() if len(bounds) == 1 else None)
        for (ep, row, _), c in zip(members, named):
            if c.label in verdicts:
                table.verdicts[ep.key][row.group.label] = verdicts[c.label]
        head = FAMILY_WORDS[role].format(**words)
        for key in eps:
            ep = next(e for e in table.endpoints if e.key == key)
            text = verdict_text(table.algo, ep, base.label, plan.kind,
                                [c for (e, _, _), c in zip(members, named) if e.key == key], verdicts, plan.alpha)
            paragraphs.append((head + " " if head else "") + text)
            head = ("Primary contrasts, continued (one Holm family with the paragraph above)." if role == "primary"
                    else "")
    table.verdict = "\n\n".join(paragraphs)
