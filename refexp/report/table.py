"""The comparison table of one algorithm: numbers per group, then the strings every output shows.

Numbers (``AlgoTable``) feed summary.json; ``header_and_cells`` turns them into the strings that
report.md, report.html and the console table all print, so the three can never disagree.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from typing import Optional

from .group import Group
from .inference import Verdict
from .paired import Comparison, Endpoint, compare, final_step, judge, step_at, verdict_text
from .plan import Plan
from .reduce import COLUMNS, GOLD, RETENTION, Column, column_estimate, start_accuracy, steps_to_target
from .stats import Estimate, mean_ci

HEADLINE_KEYS = ("acc_final", "heldout_pref_final")
"""The number a verdict is about: final held-out task accuracy, else (``task=preference``) final
held-out preference accuracy."""

DEFAULT_TARGET_MARGIN = 0.05
"""The default target when no group gained: the best group's mean start (SFT) accuracy + this, capped at 1."""


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
    from .reduce import ACC, last

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


def summarize(algo: str, groups: list[Group], target: Optional[float] = None, plan: Optional[Plan] = None,
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
            per_run = [steps_to_target(r, target) for r in g.completed]
            per_run = [s for s in per_run if s is not None]
            if per_run:
                reached = [s for s in per_run if math.isfinite(s)]
                to_target = ToTarget(len(reached), len(per_run), mean_ci(reached))
        rows.append(Row(g, cells, to_target))
    columns = [c for c in (*COLUMNS, *extra_columns) if any(row.cells[c.key] is not None for row in rows)]
    table = AlgoTable(algo, target, note, columns, rows)
    _pair_against_baseline(table, groups, plan or Plan(None, None), extra_columns)
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


def find_baseline(groups: list[Group], plan: Plan) -> tuple[Optional[Group], str]:
    """The one group the plan names as baseline, else None and why (none named, none found, several match:
    the reader names one; nothing is picked for them)."""
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


def in_comparison(group: Group, plan: Plan) -> bool:
    """Whether a group takes part in the verdict: any group of an exploratory report; with a declared block,
    a declared arm (or any, with ``--allow-mixed``)."""
    return not plan.declared or plan.allow_mixed or any(plan.arm(r) in plan.block["arms"] for r in group.runs)


def _pair_against_baseline(table: AlgoTable, groups: list[Group], plan: Plan,
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
        table.verdicts[ep.key] = judge(comparisons, plan.alpha, plan.margin)
        paragraphs.append(verdict_text(table.algo, ep, base.label, plan.kind, comparisons,
                                       table.verdicts[ep.key], plan.alpha))
    table.verdict = "\n\n".join(paragraphs)


# ---------------------------------------------------------------- strings
def _decimals(mean: float, half: Optional[float], kind: str) -> int:
    """Decimals that show the interval to two significant digits (0.0812 ± 0.0031) and never fewer
    than the kind asks for (int: 0, pct: 1, num: by the mean's magnitude, 0.612 / 12.3 / 1423); at most 6."""
    if kind == "int":
        d = 0
    elif kind == "pct":
        d = 1
    else:
        scale = abs(mean) if math.isfinite(mean) else 1.0
        d = 0 if scale >= 100 else 1 if scale >= 10 else 2 if scale >= 1 else 3
    if half is not None and math.isfinite(half) and half > 0:
        d = max(d, 1 - math.floor(math.log10(half)))
    return min(d, 6)


def cell_text(est: Optional[Estimate], kind: str = "num") -> str:
    """"0.612 ± 0.034", "0.612 (n=1)", or "—" when no completed run logged the metric."""
    if est is None:
        return "—"
    m, h = est.mean, est.half_width
    unit = ""
    if kind == "pct":
        m, h, unit = 100 * m, (100 * h if h is not None else None), "%"
    if kind == "num" and math.isfinite(m) and 0 < max(abs(m), h or 0.0) < 1e-3:
        fmt = "{:.2e}"  # a KL of 3e-05 is not "0.000"
    else:
        fmt = "{:.%df}" % _decimals(m, h, kind)
    text = fmt.format(m) + unit
    if h is None:
        return text + " (n=1)"
    return text + " ± " + fmt.format(h) + unit + (" (n=1)" if est.n == 1 else "")


def error_cell(text: str, limit: int = 300) -> str:
    """An error as one table cell: the last non-empty line of a traceback says what went wrong."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def seed_t_text(c: Optional[Comparison]) -> str:
    """The seed-only Student-t 95% interval (over the per-start means with several SFT starts): "+0.065 ± 0.041"
    (signed), "+0.020 (n=1)", or "—"."""
    if c is None or c.seed_t is None:
        return "—"
    text = cell_text(c.seed_t)
    return text if text.startswith("-") else "+" + text


def paired_cells(c: Optional[Comparison], v: Optional[Verdict]) -> list[str]:
    """Δ with its family-adjusted interval (marked "seed-only" without per-prompt outcomes), Holm p, verdict."""
    if c is None:
        return ["—", "", "outside the comparison"]
    if v is None:
        return [c.no_claim, "", "no claim"]
    lo, hi = v.interval
    delta = f"{v.result.point:+.3f} [{lo:+.3f}, {hi:+.3f}]" + (" seed-only" if c.seed_only else "")
    return [delta, f"{v.p_holm:.3g}", v.word]


def _family_level(table: AlgoTable, key: str) -> str:
    """"Bonferroni 98.75%": the level of the endpoint's family intervals (1 - alpha/m)."""
    v = next(iter(table.verdicts.get(key, {}).values()), None)
    return f"Bonferroni {100 * (1 - v.alpha / v.family_size):.4g}%" if v else "no interval"


def target_text(t: Optional[ToTarget]) -> str:
    """Steps to target: "never", "120 ± 30", or "140 (n=1)"; "(2/3 seeds)" when not all reached."""
    if t is None:
        return "—"
    if t.reached == 0:
        return "never"
    text = cell_text(t.estimate, "int")
    return text if t.reached == t.n else f"{text} ({t.reached}/{t.n} seeds)"


def seeds_text(row: Row) -> str:
    """Completed seeds; "2 of 3" when a run of the group failed or is unfinished."""
    total = len(row.group.runs)
    return str(row.n_completed) if row.n_completed == total else f"{row.n_completed} of {total}"


def header_and_cells(table: AlgoTable) -> tuple[list[str], list[list[str]]]:
    """The table as strings: group label, every column with data, steps to target, seeds."""
    header = ["group"] + [c.header for c in table.columns]
    for ep in table.endpoints:
        header += [f"Δ {ep.header} vs {table.baseline} (paired, {_family_level(table, ep.key)})",
                   f"Holm p ({ep.header})", f"verdict ({ep.header})"]
    if table.endpoints:
        several = any(len(row.paired[table.endpoints[0].key].seeds_per_start) > 1 for row in table.rows
                      if table.endpoints[0].key in row.paired)
        header.append(f"Δ {table.headline.header} {'SFT-start-mean' if several else 'seed-only'} t 95%")
    if table.target is not None:
        header.append(f"steps to acc≥{table.target:.3g}")
    header.append("seeds")
    body = []
    for row in table.rows:
        cells = [row.group.label] + [cell_text(row.cells[c.key], c.kind) for c in table.columns]
        base = row.group.label == table.baseline
        for ep in table.endpoints:
            c = row.paired.get(ep.key)
            cells += ["baseline", "", ""] if base else paired_cells(c, table.verdicts[ep.key].get(row.group.label))
        if table.endpoints:
            cells.append("baseline" if base else seed_t_text(row.paired.get(table.endpoints[0].key)))
        if table.target is not None:
            cells.append(target_text(row.to_target))
        cells.append(seeds_text(row))
        body.append(cells)
    return header, body


def format_table(report) -> str:
    """The report's tables (and the runs left out) as text for a terminal, via rich."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text  # Text, not str: a "[...]" in a label or error is not rich markup

    # Natural width, never squeezed to the terminal: a truncated group label or a number broken over
    # two lines misleads more than a long line does.
    console = Console(file=io.StringIO(), width=1000, color_system=None, force_terminal=False)
    for algo, table in report.tables.items():
        header, body = header_and_cells(table)
        title = f"{algo.upper()}: mean ± 95% CI across seeds"
        if table.target is not None:
            title += f" (target acc {table.target:.3g}, {table.target_note})"
        console.print(Text(title))  # above, not as the table's title: rich would wrap it to the table's width
        t = Table(box=box.SIMPLE)
        for h in header:
            t.add_column(Text(h))
        for cells in body:
            t.add_row(*map(Text, cells))
        console.print(t)
    if report.problems:
        console.print(f"Not counted ({len(report.problems)} runs):")
        for p in report.problems:
            console.print(f"  {p.name} [{p.algo} {p.label}] {p.state}: {error_cell(p.error)}", markup=False)
    return "\n".join(line.rstrip() for line in console.file.getvalue().splitlines()) + "\n"
