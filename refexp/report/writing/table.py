"""The comparison table of one algorithm as the strings every output shows.

The numbers (``AlgoTable``, ``refexp/report/statistics/summary.py``) feed summary.json; ``header_and_cells``
turns them into the strings that report.md, report.html and the console table all print, so the three can never
disagree.
"""

from __future__ import annotations

import io
from typing import Optional

from refexp.report.statistics.inference import Verdict
from refexp.report.statistics.paired import Comparison
from refexp.report.statistics.summary import AlgoTable, Row, ToTarget
from refexp.report.writing.cells import cell_text


# ---------------------------------------------------------------- strings
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


def verdict_cell(v: Verdict) -> str:
    """The verdict as a table cell, beside its interval: "higher", "higher (Holm; the simultaneous interval covers
    0)", "equivalent within ±0.05", "inconclusive", "degenerate t: no claim"."""
    if v.interval_covers_zero:
        return v.phrase
    return "degenerate t: no claim" if v.degenerate else v.word


def paired_cells(c: Optional[Comparison], v: Optional[Verdict]) -> list[str]:
    """Δ with its simultaneous interval ("uninformative (1 df)" past the metric's range; marked "seed-only" without
    per-prompt outcomes), Holm p, verdict."""
    if c is None:
        return ["—", "", "outside the comparison"]
    if v is None:
        return [c.no_claim, "", "no claim"]
    delta = f"{v.result.point:+.3f} {v.interval_text}" + (" seed-only" if c.seed_only else "")
    return [delta, v.p_text, verdict_cell(v)]


def _family_level(table: AlgoTable, key: str) -> str:
    """"simultaneous 98.75%": the level of the endpoint's family intervals (Bonferroni, 1 - alpha/m)."""
    v = next(iter(table.verdicts.get(key, {}).values()), None)
    return f"simultaneous {100 * (1 - v.alpha / v.family_size):.4g}%" if v else "no interval"


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
