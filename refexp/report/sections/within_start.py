"""Each algorithm's comparison within each SFT start, when the counted runs come from several: conditional on a
start, its seeds then prompts are the units of the verdict, where the main table's unit is the start.
summary.json: ``algos.<algo>.within_sft_start``."""

from __future__ import annotations

from dataclasses import replace

from refexp.report.reading.load import sft_start_keys
from refexp.report.sections.base import AlgorithmSection, Sweep
from refexp.report.sections.comparison import paired_dict, verdict_paragraphs
from refexp.report.statistics.summary import AlgoTable, summarize
from refexp.report.writing.blocks import Heading, Paragraph, table_of
from refexp.report.writing.table import header_and_cells

WITHIN_START = (
    "These comparisons over this SFT start's runs alone: conditional on the start, its seeds then prompts are "
    "the units (the sections above take the start as the unit, so with few starts they separate little). A "
    "difference here holds for this start; whether it holds for SFT starts in general is the question the "
    "sections above answer.")


def within_starts(sweep: Sweep, algo: str) -> dict[str, AlgoTable]:
    """SFT start -> the table of its runs alone, when the counted runs come from several starts (else empty)."""
    groups, plan = sweep.groups[algo], sweep.plan
    starts = sft_start_keys(r for g in groups for r in g.completed if plan.counts(r))
    if len(starts) < 2:
        return {}
    return {s: summarize(algo, [replace(g, runs=[r for r in g.runs if r.sft_start == s]) for g in groups],
                         sweep.target, plan, sweep.extra_columns, conditional=True) for s in starts}


class WithinStart(AlgorithmSection):
    name = "within"

    def compute(self, sweep: Sweep, algo: str):
        return within_starts(sweep, algo)

    def blocks(self, report, algo: str) -> list:
        out = []
        for start, inside in report.within.get(algo, {}).items():
            out += [Heading(f"{algo.upper()} within SFT start {start}", level=3), Paragraph(WITHIN_START)]
            out += verdict_paragraphs(inside) + [table_of(*header_and_cells(inside))]
        return out

    def summary(self, report, algo: str) -> dict:
        return {"within_sft_start": {start: {"verdict": inside.verdict, "paired_vs_baseline": {
            row.group.label: paired_dict(inside, row) for row in inside.rows}}
            for start, inside in report.within.get(algo, {}).items()}}
