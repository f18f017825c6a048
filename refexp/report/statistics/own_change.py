"""What each group kept: a held-out metric's change from the run's own start (``eval/retention`` at its last
evaluation minus its step-0 evaluation, the SFT start it began from), with the verdict table's interval.

Every run is evaluated at step 0 and at the end on the same held-out prompts, so the change is paired by prompt
within the run, and the runs of a group are replicates (SFT start, seed). The interval is the verdict table's
(``paired.unit_result``): a hierarchical bootstrap over seeds (or starts, then seeds), then prompts, that must
agree with Student's t over the per-seed (per-start) changes, and the verdict is ``inference``'s (Holm's step-down
decides; inconclusive is no claim of no change, which needs the equivalence margin). One algorithm's groups form
one Holm family, so "the run without a reference forgot" is read off one table with simultaneous intervals.

With several SFT starts the start is the unit of that interval (``paired``'s module doc): a change that every
start shows but by different amounts stays inconclusive with two starts. The same table within each start
(conditional on that start: seeds, then prompts) says what happened on each start the sweep trained from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from refexp.record.metric_names import EVAL_RETENTION
from refexp.report.reading.group import Group
from refexp.report.reading.load import Run, sft_start_keys
from refexp.report.statistics.inference import Verdict, difference_bound, family_verdicts
from refexp.report.statistics.paired import Leaf, Unit, final_step, unit_result

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
    """One algorithm's table: a row per group that logged the metric, their Holm family's verdicts, the text;
    with several SFT starts, the same table within each start (``within``)."""

    metric: str
    rows: list[OwnChange] = field(default_factory=list)
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    text: str = ""
    within: dict[str, "OwnChanges"] = field(default_factory=dict)
    """SFT start -> the table of its runs alone: conditional on that start, seeds then prompts are the units."""


def run_change(run: Run, metric: str) -> Optional[tuple[Leaf, float]]:
    """(the run's final and step-0 per-prompt scores over the prompts both scored and their ids, final - step-0
    mean); None
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
    return (a, b, ids), sum(a) / len(a) - sum(b) / len(b)


def own_changes(groups: list[Group], counts: Callable[[Run], bool], *, alpha: float, margin: Optional[float],
                metric: str = EVAL_RETENTION) -> Optional[OwnChanges]:
    """Every group's change of ``metric`` from its runs' starts, over the completed runs ``counts`` admits, and
    with several SFT starts the same within each start; None when no run has a change to measure."""
    out = _table(groups, counts, alpha, margin, metric)
    if out is None:
        return None
    starts = sft_start_keys(r for g in groups for r in g.completed if counts(r))
    if len(starts) > 1:
        for start in starts:
            inside = _table(groups, lambda r, s=start: counts(r) and r.sft_start == s, alpha, margin, metric)
            if inside is not None:
                out.within[start] = inside
    return out


def _table(groups: list[Group], counts: Callable[[Run], bool], alpha: float, margin: Optional[float],
           metric: str) -> Optional[OwnChanges]:
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
                                   margin=margin, bound=difference_bound(metric))
    n = len(out.verdicts)
    parts = [f"Each group's final {metric} minus {START} (the SFT start it trained from), paired by prompt within "
             f"each run; family: {n} group{'s' * (n != 1)}, Holm-adjusted, alpha {alpha:g}."]
    parts += [out.verdicts[r.label].sentence(START) for r in out.rows if r.label in out.verdicts]
    unclaimed = [f"{r.label} ({r.no_claim})" for r in out.rows if r.result is None]
    if unclaimed:
        parts.append("No claim: " + "; ".join(unclaimed) + ".")
    out.text = " ".join(parts)
    return out
