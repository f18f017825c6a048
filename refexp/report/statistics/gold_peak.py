"""Each group's held-out gold at its peak, and each arm at its gold peak against the baseline's: the two numbers
that say whether optimising a learned proxy helped before it hurt (Gao, Schulman and Hilton 2022, "Scaling Laws for
Reward Model Overoptimization": gold first rises with the proxy, then falls).

The peak is chosen on validation, never on test: per group, the evaluation step after step 0 with the highest mean
validation gold over the group's runs (the chooser: ``val/gold`` on the first ``comparison.select.budget`` validation
prompts where the block declares a budget, else on the whole validation split), one step for every run of the group
so the runs stay replicates. Test gold is read there:

* *the rise*: each group's test gold at its peak minus its own step-0 evaluation, paired by prompt within each run,
  with ``own_change``'s interval and rule (``paired.unit_result``: seeds, or SFT starts then seeds, then prompts);
  the groups are one Holm family;
* *each arm at its peak*: per declared arm, its group with the highest chosen-step validation gold (a beta and a
  step, both chosen on validation), its test gold there minus the baseline arm's at the baseline's own choice,
  paired by (SFT start, seed) and prompt; the arms other than the baseline are one Holm family.

Secondary: neither family is a pre-registered contrast unless the block says so; the report says which.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from refexp.record.metric_names import EVAL_GOLD, KL_INIT, VAL_GOLD
from refexp.report.reading.comparison_plan import ComparisonPlan
from refexp.report.reading.group import Group
from refexp.report.reading.load import Run
from refexp.report.statistics.inference import Verdict, difference_bound, family_verdicts
from refexp.report.statistics.paired import Leaf, Unit, unit_result

START = "its step-0 evaluation"


@dataclass
class GroupPeak:
    """One group's chosen step and its test gold there, with the change from step 0 (``result``, None: no claim)."""

    label: str
    arm: Optional[str]
    runs: list[Run]
    step: Optional[int] = None
    val: Optional[float] = None
    """The chooser's mean over the group's runs at ``step``."""
    kl_init: Optional[float] = None
    start: Optional[float] = None
    at_peak: Optional[float] = None
    final: Optional[float] = None
    units: list[Unit] = field(default_factory=list)
    result: object = None
    no_claim: str = ""


@dataclass
class ArmPeak:
    """One arm's best group at its peak against the baseline arm's (``result``: arm - baseline, paired)."""

    arm: str
    group: GroupPeak
    units: list[Unit] = field(default_factory=list)
    result: object = None
    no_claim: str = ""


@dataclass
class GoldPeaks:
    chooser: str
    """The chooser in words (what the step was chosen on)."""
    rows: list[GroupPeak] = field(default_factory=list)
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    baseline: Optional[str] = None
    arms: list[ArmPeak] = field(default_factory=list)
    arm_verdicts: dict[str, Verdict] = field(default_factory=dict)


def chooser_scores(run: Run, budget: Optional[int]) -> dict[int, float]:
    """step -> the run's validation gold there: the mean of prompts 0 .. budget-1 (a step lacking one of them is
    left out), or the logged ``val/gold`` of the whole split without a budget."""
    if budget is None:
        return {int(s): float(v) for s, v in zip(*run.series(VAL_GOLD))}
    out = {}
    for step, scores in run.outcomes_of(VAL_GOLD).items():
        if all(i in scores for i in range(budget)):
            out[int(step)] = float(np.mean([scores[i] for i in range(budget)]))
    return out


def choose_step(runs: list[Run], budget: Optional[int]) -> tuple[Optional[int], Optional[float]]:
    """(the evaluation step after 0 that every run scored on the chooser, with the highest mean over the runs; that
    mean); (None, None) without one. Ties go to the earliest step."""
    per_run = [chooser_scores(r, budget) for r in runs]
    steps = sorted(set.intersection(*(set(s) for s in per_run)) - {0}) if per_run else []
    if not steps:
        return None, None
    means = [float(np.mean([s[step] for s in per_run])) for step in steps]
    best = int(np.argmax(means))
    return steps[best], means[best]


def _scores_at(run: Run, step: int) -> Optional[dict[int, float]]:
    return run.outcomes_of(EVAL_GOLD).get(step)


def _value_at(run: Run, key: str, step: int) -> Optional[float]:
    steps, values = run.series(key)
    hit = [float(v) for s, v in zip(steps, values) if int(s) == step]
    return hit[-1] if hit else None


def _mean(values: list[Optional[float]]) -> Optional[float]:
    got = [v for v in values if v is not None]
    return float(np.mean(got)) if got and len(got) == len(values) else None


def _leaf(a: dict[int, float], b: dict[int, float]) -> Optional[tuple[Leaf, float]]:
    """(the two evaluations' scores over the prompts both scored and their ids, a - b of their means)."""
    ids = [i for i in a if i in b]
    if not ids:
        return None
    x, y = [a[i] for i in ids], [b[i] for i in ids]
    return (x, y, ids), float(np.mean(x) - np.mean(y))


def group_peak(label: str, arm: Optional[str], runs: list[Run], budget: Optional[int]) -> GroupPeak:
    """The group's chosen step, its means there and its change from step 0 (``runs``: its counted completed runs
    with a seed)."""
    row = GroupPeak(label, arm, runs)
    row.step, row.val = choose_step(runs, budget)
    if row.step is None:
        row.no_claim = "no evaluation after step 0 on the validation gold to choose the peak on"
        return row
    units: dict[Unit, tuple[Leaf, float]] = {}
    for r in runs:
        peak, start = _scores_at(r, row.step), _scores_at(r, 0)
        got = None if peak is None or start is None else _leaf(peak, start)
        if got is not None:
            units[(r.sft_start, r.seed)] = got
    row.kl_init = _mean([_value_at(r, KL_INIT, row.step) for r in runs])
    row.start = _mean([_value_at(r, EVAL_GOLD, 0) for r in runs])
    row.at_peak = _mean([_value_at(r, EVAL_GOLD, row.step) for r in runs])
    finals = [r.series(EVAL_GOLD)[1] for r in runs]
    row.final = _mean([float(v[-1]) if len(v) else None for v in finals])
    row.units = sorted(units)
    if not units:
        row.no_claim = "no per-prompt test gold at step 0 and at the peak"
        return row
    row.result, _, why = unit_result(units)
    row.no_claim = "" if row.result is not None else ("one run" if why == "one paired seed" else why)
    return row


def arm_peak(arm: str, row: GroupPeak, base: GroupPeak) -> ArmPeak:
    """The arm's chosen group at its step minus the baseline's at its own, paired by (SFT start, seed) and prompt."""
    out = ArmPeak(arm, row)
    theirs = {(r.sft_start, r.seed): r for r in base.runs}
    units: dict[Unit, tuple[Leaf, float]] = {}
    for r in row.runs:
        b = theirs.get((r.sft_start, r.seed))
        a_scores = _scores_at(r, row.step)
        b_scores = None if b is None else _scores_at(b, base.step)
        got = None if a_scores is None or b_scores is None else _leaf(a_scores, b_scores)
        if got is not None:
            units[(r.sft_start, r.seed)] = got
    out.units = sorted(units)
    if not units:
        out.no_claim = f"no replicate (SFT start, seed) with per-prompt test gold in both {arm} and the baseline"
        return out
    out.result, _, why = unit_result(units)
    out.no_claim = "" if out.result is not None else ("one paired seed" if why == "one paired seed" else why)
    return out


def gold_peaks(groups: list[Group], counts: Callable[[Run], bool], plan: ComparisonPlan) -> Optional[GoldPeaks]:
    """Both tables over one algorithm's groups, or None when no counted completed run logged test and validation
    gold with per-prompt test scores."""
    budget = ((plan.block or {}).get("select") or {}).get("budget")
    chooser = (f"{VAL_GOLD} on the first {budget} validation prompts (comparison.select.budget)" if budget
               else f"{VAL_GOLD} on the whole validation split")
    out = GoldPeaks(chooser)
    for g in groups:
        runs = [r for r in g.completed if counts(r) and r.seed is not None and r.outcomes_of(EVAL_GOLD)
                and len(r.series(VAL_GOLD)[0])]
        if runs:
            out.rows.append(group_peak(g.label, plan.arm(runs[0]), runs, budget))
    if not out.rows:
        return None
    bound = difference_bound(EVAL_GOLD)
    out.verdicts = family_verdicts({r.label: r.result for r in out.rows if r.result is not None},
                                   alpha=plan.alpha, margin=plan.margin, bound=bound)
    if plan.declared and plan.baseline is not None:
        best: dict[str, GroupPeak] = {}
        for r in out.rows:
            if r.arm is not None and r.val is not None and (r.arm not in best or r.val > best[r.arm].val):
                best[r.arm] = r
        base = best.get(str(plan.baseline))
        if base is not None:
            out.baseline = str(plan.baseline)
            out.arms = [arm_peak(arm, best[arm], base) for arm in (plan.block or {}).get("arms", [])
                        if arm in best and arm != out.baseline]
            out.arm_verdicts = family_verdicts({a.arm: a.result for a in out.arms if a.result is not None},
                                               alpha=plan.alpha, margin=plan.margin, bound=bound)
    return out
