"""Each group's own change (``statistics/own_change.py``): its change of ``eval/retention`` from its runs' step-0
evaluation, with the verdict table's interval, as a paragraph and a table under its algorithm ("What each group
kept."), and summary.json's ``algos.<algo>.kept`` (the key committed summaries carry, so it keeps that name)."""

from __future__ import annotations

from refexp.report.sections.base import AlgorithmSection, Sweep
from refexp.report.statistics.inference import Verdict
from refexp.report.statistics.own_change import OwnChanges, own_changes
from refexp.report.writing.blocks import Paragraph, table_of

CHANGE_WORDS = {"lower": "fell", "higher": "rose", "degenerate t": "degenerate t: no claim"}
"""A change from a run's own start in a table cell: its verdict words as a change's."""


def change_cell(v: Verdict, words: dict[str, str] = CHANGE_WORDS) -> str:
    """``-0.155 [-0.190, -0.120] fell``: the difference, its simultaneous interval and its verdict word (``words``
    renames one), flagged where Holm rejects while the interval covers 0; an uninformative interval prints as such."""
    if v.word == "inconclusive" and v.uninformative:
        return f"{v.result.point:+.3f} {v.phrase}"
    word = words.get(v.word, v.word)
    if v.interval_covers_zero:
        word += " (Holm; the simultaneous interval covers 0)"
    return f"{v.result.point:+.3f} {v.interval_text} {word}"


def _cell(oc: OwnChanges, label: str) -> str:
    """``change_cell`` for one group of one table ("—" when it has no row)."""
    v = oc.verdicts.get(label)
    if v is None:
        row = next((r for r in oc.rows if r.label == label), None)
        return "—" if row is None else (row.no_claim or "no claim")
    return change_cell(v)


def rows(oc: OwnChanges) -> list[list[str]]:
    """The table's cells: group, runs, change with its Bonferroni interval and verdict, Holm p, then the same
    change within each SFT start."""
    cells = []
    for r in oc.rows:
        v = oc.verdicts.get(r.label)
        cells.append([r.label, str(len(r.units)), _cell(oc, r.label), "—" if v is None else v.p_text,
                      *(_cell(inside, r.label) for inside in oc.within.values())])
    return cells


def header(oc: OwnChanges) -> list[str]:
    return (["group", "runs", f"Δ {oc.metric} from step 0 [simultaneous interval]", "Holm p"]
            + [f"within SFT start {start}" for start in oc.within])


def summary(oc: OwnChanges) -> dict:
    """The numbers for summary.json."""
    return {"metric": oc.metric, "text": oc.text, "within": {s: summary(t) for s, t in oc.within.items()}, "rows": [
        {"group": r.label, "replicates": [list(u) for u in r.units], "no_claim": r.no_claim or None,
         **({"change": oc.verdicts[r.label].result.point, "interval": list(oc.verdicts[r.label].interval),
             "p_holm": oc.verdicts[r.label].p_holm, "verdict": oc.verdicts[r.label].word,
             "verdict_text": oc.verdicts[r.label].phrase}
            if r.label in oc.verdicts else {})} for r in oc.rows]}


class OwnChange(AlgorithmSection):
    name = "own_changes"

    def compute(self, sweep: Sweep, algo: str):
        plan = sweep.plan
        return own_changes(sweep.groups[algo], plan.counts, alpha=plan.alpha, margin=plan.margin)

    def blocks(self, report, algo: str) -> list:
        oc = report.own_changes.get(algo)
        if oc is None:
            return []
        return [Paragraph(oc.text, lead="What each group kept."), table_of(header(oc), rows(oc))]

    def summary(self, report, algo: str) -> dict:
        return {"kept": summary(report.own_changes[algo]) if algo in report.own_changes else None}
