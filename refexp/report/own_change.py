"""What each group kept: a held-out metric's change from the run's own start (``eval/retention`` at its last
evaluation minus its step-0 evaluation, the SFT start it began from), with the verdict table's interval.

Every run is evaluated at step 0 and at the end on the same held-out prompts, so the change is paired by prompt
within the run, and the runs of a group are replicates (SFT start, seed). The interval is the verdict table's
(``paired.unit_result``): a hierarchical bootstrap over seeds (or starts, then seeds), then prompts, that must
agree with Student's t over the per-seed (per-start) changes. One algorithm's groups form one Holm family, so
"the run without a reference forgot" and "the fixed reference at beta 1 kept it" are read off one table with
simultaneous intervals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from refexp.record.metric_names import EVAL_RETENTION

from .group import Group
from .inference import Verdict, family_verdicts
from .load import Run
from .paired import Leaf, Unit, final_step, unit_result

START = "its step-0 evaluation"
"""What a change is measured from, as the verdict sentences name it."""


@dataclass
class OwnChange:
    """One group's change: its replicates and the paired result (None: fewer than 2 replicates)."""

    label: str
    units: list[Unit]
    result: object = None
    no_claim: str = ""


@dataclass
class OwnChanges:
    """One algorithm's table: a row per group that logged the metric, their Holm family's verdicts, the text."""

    metric: str
    rows: list[OwnChange] = field(default_factory=list)
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    text: str = ""


def run_change(run: Run, metric: str) -> Optional[tuple[Leaf, float]]:
    """(the run's final and step-0 per-prompt scores over the prompts both scored, final - step-0 mean); None
    without a step-0 and a later final evaluation of ``metric`` with outcomes."""
    by_step = run.outcomes_of(metric)
    end = final_step(run, metric)
    if end is None or end == 0 or 0 not in by_step:
        return None
    final, start = by_step[end], by_step[0]
    ids = [i for i in final if i in start]
    if not ids:
        return None
    a, b = [final[i] for i in ids], [start[i] for i in ids]
    return (a, b), sum(a) / len(a) - sum(b) / len(b)


def own_changes(groups: list[Group], counts: Callable[[Run], bool], *, alpha: float, margin: Optional[float],
                metric: str = EVAL_RETENTION) -> Optional[OwnChanges]:
    """Every group's change of ``metric`` from its runs' starts, over the completed runs ``counts`` admits; None
    when no run has a change to measure."""
    out = OwnChanges(metric)
    for g in groups:
        units: dict[Unit, tuple[Leaf, float]] = {}
        for r in g.completed:
            got = run_change(r, metric) if r.seed is not None and counts(r) else None
            if got is not None:
                units[(r.sft_start, r.seed)] = got
        if not units:
            continue
        result, _, why = unit_result(units)
        out.rows.append(OwnChange(g.label, sorted(units), result, "one run" if why == "one paired seed" else why))
    if not out.rows:
        return None
    out.verdicts = family_verdicts({r.label: r.result for r in out.rows if r.result is not None}, alpha=alpha,
                                   margin=margin)
    n = len(out.verdicts)
    parts = [f"Each group's final {metric} minus {START} (the SFT start it trained from), paired by prompt within "
             f"each run; family: {n} group{'s' * (n != 1)}, Holm-adjusted, alpha {alpha:g}."]
    parts += [out.verdicts[r.label].sentence(START) for r in out.rows if r.label in out.verdicts]
    unclaimed = [f"{r.label} ({r.no_claim})" for r in out.rows if r.result is None]
    if unclaimed:
        parts.append("No claim: " + "; ".join(unclaimed) + ".")
    out.text = " ".join(parts)
    return out


def rows(oc: OwnChanges) -> list[list[str]]:
    """The table's cells: group, replicates, change, Bonferroni interval, Holm p, verdict."""
    cells = []
    for r in oc.rows:
        v = oc.verdicts.get(r.label)
        if v is None:
            cells.append([r.label, str(len(r.units)), "—", "—", "—", r.no_claim or "no claim"])
        else:
            word = {"lower": "fell", "higher": "rose"}.get(v.word, v.word)
            cells.append([r.label, str(len(r.units)), f"{v.result.point:+.3f}",
                          f"[{v.interval[0]:+.3f}, {v.interval[1]:+.3f}]", f"{v.p_holm:.3g}", word])
    return cells


def header(oc: OwnChanges) -> list[str]:
    return ["group", "runs", f"Δ {oc.metric} from step 0", "Bonferroni interval", "Holm p", "verdict"]


def summary(oc: OwnChanges) -> dict:
    """The numbers for summary.json."""
    return {"metric": oc.metric, "text": oc.text, "rows": [
        {"group": r.label, "replicates": [list(u) for u in r.units], "no_claim": r.no_claim or None,
         **({"change": oc.verdicts[r.label].result.point, "interval": list(oc.verdicts[r.label].interval),
             "p_holm": oc.verdicts[r.label].p_holm, "verdict": oc.verdicts[r.label].word}
            if r.label in oc.verdicts else {})} for r in oc.rows]}
