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
from .paired import Paired, find_baseline, paired_difference, verdict
from .reduce import COLUMNS, Column, column_estimate, start_accuracy, steps_to_target
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
    paired: Optional[Paired] = None
    """The headline number's seed-paired difference against the baseline (None for the baseline itself)."""

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


def summarize(algo: str, groups: list[Group], target: Optional[float] = None, baseline: str = "fixed",
              extra_columns: tuple[Column, ...] = ()) -> AlgoTable:
    """Mean ± 95% CI across the completed seeds of every group, for every column with data, and the
    headline number's seed-paired difference against the ``baseline`` group (a label or a strategy)."""
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
    _pair_against_baseline(table, groups, baseline)
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


def _pair_against_baseline(table: AlgoTable, groups: list[Group], baseline: str) -> None:
    """Fill each row's ``paired`` and the table's ``verdict`` (nothing without a headline or baseline)."""
    table.headline = next((c for c in table.columns if c.key in HEADLINE_KEYS), None)
    base = find_baseline(groups, baseline)
    if table.headline is None or base is None:
        table.verdict = (f"{table.algo.upper()}: no {baseline!r} group to pair against (--baseline picks "
                         f"another: a strategy or a group label)." if table.headline else "")
        return
    table.baseline = base.label
    for row in table.rows:
        if row.group is not base:
            row.paired = paired_difference(row.group, base, table.headline.per_run)
    table.verdict = verdict(table.algo, table.headline.doc_name,
                            {row.group.label: row.paired for row in table.rows if row.paired is not None})


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


def paired_text(p: Paired) -> str:
    """"+0.065 ± 0.041" (signed), "+0.020 (n=1)", or "no common seed"."""
    if p.estimate is None:
        return "no common seed"
    text = cell_text(p.estimate)
    return text if text.startswith("-") else "+" + text


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
    if table.baseline is not None:
        header.append(f"Δ {table.headline.header} vs {table.baseline} (paired)")
    if table.target is not None:
        header.append(f"steps to acc≥{table.target:.3g}")
    header.append("seeds")
    body = []
    for row in table.rows:
        cells = [row.group.label] + [cell_text(row.cells[c.key], c.kind) for c in table.columns]
        if table.baseline is not None:
            cells.append("baseline" if row.paired is None else paired_text(row.paired))
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
