"""The report's gold-peak tables (``statistics/gold_peak.py``): each group's test gold at the step validation
chose against its own step 0, and each arm at its gold peak against the baseline's; their text, cells and
summary.json entries (``algos.<algo>.gold_peak``). Written per algorithm where counted runs log test and validation
gold; secondary."""

from __future__ import annotations

from typing import Optional

from refexp.report.sections.base import AlgorithmSection, Sweep
from refexp.report.sections.own_change import CHANGE_WORDS, change_cell
from refexp.report.statistics.gold_peak import START, GoldPeaks, gold_peaks
from refexp.report.statistics.inference import Verdict
from refexp.report.writing.blocks import Paragraph, table_of

TITLE = "Gold at its peak"
RISE_HEADER = ["group", "runs", "peak step (chosen on validation)", "kl/init there", "gold at step 0",
               "gold at peak", "Δ peak − step 0 [simultaneous interval]", "Holm p", "final gold"]
ARM_HEADER = ["arm", "its group at its peak", "step", "gold at peak", "Δ vs baseline at its peak "
              "[simultaneous interval]", "Holm p"]


def _num(x: Optional[float]) -> str:
    return "—" if x is None else f"{x:.3f}"


def _cell(v: Optional[Verdict], no_claim: str, words: dict[str, str]) -> str:
    return no_claim or "no claim" if v is None else change_cell(v, words)


def rise_text(p: GoldPeaks, alpha: float) -> str:
    n = len(p.verdicts)
    intro = (
        f"Secondary: whether optimising the proxy raised the held-out gold before it lowered it (Gao, Schulman and "
        f"Hilton 2022). Per group, the peak is the evaluation step after step 0 with the highest mean {p.chooser} "
        f"over its runs (chosen on validation, never on test; one step for all its runs), and eval/gold is read "
        f"there on the test prompts: its change from {START}, paired by prompt within each run; family: {n} "
        f"group{'s' * (n != 1)}, Holm-adjusted, alpha {alpha:g}.")
    return _family(intro, p.verdicts, [(r.label, r.no_claim) for r in p.rows], START)


def arm_text(p: GoldPeaks, alpha: float) -> str:
    n = len(p.arm_verdicts)
    intro = (
        f"Secondary: each arm at its gold peak, its group and step both chosen on {p.chooser}: the group and step "
        f"above with the highest chosen-step validation gold, its test eval/gold there minus {p.baseline}'s "
        f"at its own choice, paired by SFT start, seed and prompt; family: {n} comparison{'s' * (n != 1)}, "
        f"Holm-adjusted, alpha {alpha:g}.")
    return _family(intro, p.arm_verdicts, [(a.arm, a.no_claim) for a in p.arms], p.baseline)


def _family(intro: str, verdicts: dict[str, Verdict], rows: list[tuple[str, str]], against: str) -> str:
    """The intro, each row's verdict sentence against ``against`` in row order, then the rows with no claim and why
    (``rows``: (label, why no claim))."""
    parts = [intro] + [verdicts[label].sentence(against) for label, _ in rows if label in verdicts]
    unclaimed = [f"{label} ({why})" for label, why in rows if label not in verdicts]
    if unclaimed:
        parts.append("No claim: " + "; ".join(unclaimed) + ".")
    return " ".join(parts)


def rise_rows(p: GoldPeaks) -> list[list[str]]:
    return [[r.label, str(len(r.runs)), "—" if r.step is None else str(r.step), _num(r.kl_init), _num(r.start),
             _num(r.at_peak), _cell(p.verdicts.get(r.label), r.no_claim, CHANGE_WORDS),
             "—" if r.label not in p.verdicts else p.verdicts[r.label].p_text, _num(r.final)] for r in p.rows]


def arm_rows(p: GoldPeaks) -> list[list[str]]:
    words = {"degenerate t": CHANGE_WORDS["degenerate t"]}  # a difference between arms: higher/lower as they are
    return [[a.arm, a.group.label, str(a.group.step), _num(a.group.at_peak),
             _cell(p.arm_verdicts.get(a.arm), a.no_claim, words),
             "—" if a.arm not in p.arm_verdicts else p.arm_verdicts[a.arm].p_text] for a in p.arms]


def _verdict_dict(v: Optional[Verdict]) -> dict:
    return {} if v is None else {"change": v.result.point, "interval": list(v.interval), "p_holm": v.p_holm,
                                 "verdict": v.word, "verdict_text": v.phrase}


def summary(p: GoldPeaks, alpha: float) -> dict:
    """The numbers for summary.json."""
    return {
        "role": "secondary", "chooser": p.chooser, "text": rise_text(p, alpha),
        "groups": [{"group": r.label, "arm": r.arm, "runs": len(r.runs), "peak_step": r.step,
                    "chooser_at_peak": r.val, "kl_init_at_peak": r.kl_init, "gold_step_0": r.start,
                    "gold_at_peak": r.at_peak, "gold_final": r.final, "no_claim": r.no_claim or None,
                    **_verdict_dict(p.verdicts.get(r.label))} for r in p.rows],
        "baseline": p.baseline, "arms_text": arm_text(p, alpha) if p.arms else None,
        "arms": [{"arm": a.arm, "group": a.group.label, "peak_step": a.group.step, "gold_at_peak": a.group.at_peak,
                  "replicates": [list(u) for u in a.units], "no_claim": a.no_claim or None,
                  **_verdict_dict(p.arm_verdicts.get(a.arm))} for a in p.arms]}


class GoldPeak(AlgorithmSection):
    name = "peaks"

    def compute(self, sweep: Sweep, algo: str):
        return gold_peaks(sweep.groups[algo], sweep.plan.counts, sweep.plan)

    def blocks(self, report, algo: str) -> list:
        p, alpha = report.peaks.get(algo), report.plan.alpha
        if p is None:
            return []
        out = [Paragraph(rise_text(p, alpha), lead=f"{TITLE}."), table_of(RISE_HEADER, rise_rows(p))]
        if p.arms:
            out += [Paragraph(arm_text(p, alpha), lead="Each arm at its gold peak."), table_of(ARM_HEADER, arm_rows(p))]
        return out

    def summary(self, report, algo: str) -> dict:
        return {"gold_peak": summary(report.peaks[algo], report.plan.alpha) if algo in report.peaks else None}
