"""The comparison table of one algorithm in numbers: a row per group, the target, the paired comparisons
against the baseline and their verdicts (``AlgoTable``, what summary.json holds).

``refexp/report/writing/table.py`` turns these numbers into the strings every output prints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from refexp.report.reading.group import Group
from refexp.report.reading.plan import ComparisonPlan
from refexp.report.reading.reduce import COLUMNS, GOLD, RETENTION, Column, start_accuracy, steps_to_target
from refexp.report.statistics.inference import Verdict, difference_bound
from refexp.report.statistics.paired import Comparison, Endpoint, compare, final_step, judge, step_at, verdict_text
from refexp.report.statistics.stats import Estimate, mean_ci, replicate_ci, with_evaluation_noise
from refexp.report.writing.cells import cell_text


HEADLINE_KEYS = ("acc_final", "heldout_pref_final")
"""The number a verdict is about: final held-out task accuracy, else (``task=preference``) final
held-out preference accuracy."""

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
    """What the verdicts are about: the headline's final value, then the accuracy at each ``--at-steps`` step."""
    verdicts: dict[str, dict[str, Verdict]] = field(default_factory=dict)
    """endpoint key -> group label -> its verdict in the endpoint's family."""
    verdict: str = ""
    flags: list[str] = field(default_factory=list)
    """Warnings the numbers support (likelihood displacement), one sentence each."""


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
              extra_columns: tuple[Column, ...] = ()) -> AlgoTable:
    """Mean ± 95% CI across the completed seeds of every group, for every column with data, and the
    paired differences against the ``plan``'s baseline group with their verdicts (none without a plan)."""
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
    _pair_against_baseline(table, groups, plan or ComparisonPlan(None, None), extra_columns)
    table.flags = displacement_flags(rows)
    return table


def displacement_flags(rows: list[Row]) -> list[str]:
    """Likelihood displacement (Pal et al. 2024; Razin et al. 2024): groups whose chosen completions ended
    less likely than at the start, with the 95% interval below 0 (one seed: flagged without an interval)."""
    flagged = []
    for row in rows:
        est = row.cells.get("chosen_delta")
        if est is None or est.mean >= 0 or (est.half_width is not None and est.mean + est.half_width >= 0):
            continue
        flagged.append(f"{row.group.label} ({cell_text(est)})")
    if not flagged:
        return []
    return ["Likelihood displacement: the chosen completions' log-prob fell below its start in " + "; ".join(flagged)
            + " — the margin grew by pushing the chosen answers down too (Pal et al. 2024)."]


SECONDARY_ENDPOINTS = (("retention_final", RETENTION), ("gold_final", GOLD))
"""(column key, metric) of the final values compared like the headline, each a family of its own, when the table
has the column: what the reference protects (retention) and, under a learned reward, the gold reward."""


def endpoints(headline: Column, extra_columns: tuple[Column, ...], columns: tuple[Column, ...] = ()) -> list[Endpoint]:
    """The headline's final value, the final retention and gold (when ``columns``, the table's, hold them), and the accuracy
    at each ``acc@S`` column's step S."""
    out = [Endpoint(headline.key, headline.header, headline.doc_name, headline.per_run,
                    final_step if headline.key == "acc_final" else lambda r: None)]
    for key, metric in SECONDARY_ENDPOINTS:
        col = next((c for c in columns if c.key == key), None)
        if col is not None:
            out.append(Endpoint(col.key, col.header, col.doc_name, col.per_run,
                                lambda r, metric=metric: final_step(r, metric), metric=metric))
    for c in extra_columns:
        if c.key.startswith("acc_at_"):
            s = int(c.key[len("acc_at_"):])
            out.append(Endpoint(c.key, c.header, f"held-out accuracy at step {s}", c.per_run,
                                lambda r, s=s: step_at(r, s)))
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
    if key and matches:
        return None, (f"the baseline arm {plan.baseline} has {len(matches)} groups, one per {key}: the arms are "
                      f"compared at matched drift and each at its best setting (below), not group by group")
    if plan.declared and matches and ((plan.block or {}).get("select") or {}).get("metric"):
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


def _pair_against_baseline(table: AlgoTable, groups: list[Group], plan: ComparisonPlan,
                           extra_columns: tuple[Column, ...]) -> None:
    """Fill each row's ``paired``, the table's ``verdicts`` and its ``verdict`` paragraph per endpoint."""
    table.headline = next((c for c in table.columns if c.key in HEADLINE_KEYS), None)
    if table.headline is None:
        return
    base, why = find_baseline(groups, plan)
    if base is None:
        table.verdict = f"{table.algo.upper()}: {why}."
        return
    table.baseline = base.label
    table.endpoints = endpoints(table.headline, extra_columns, tuple(table.columns))
    others = [row for row in table.rows if row.group is not base and in_comparison(row.group, plan)]
    paragraphs = []
    for ep in table.endpoints:
        comparisons = [compare(row.group, base, ep, plan.counts) for row in others]
        for row, c in zip(others, comparisons):
            row.paired[ep.key] = c
        table.verdicts[ep.key] = judge(comparisons, plan.alpha, plan.margin, difference_bound(ep.metric))
        paragraphs.append(verdict_text(table.algo, ep, base.label, plan.kind, comparisons,
                                       table.verdicts[ep.key], plan.alpha))
    table.verdict = "\n\n".join(paragraphs)
