"""Each arm at its best: the hyper-parameters a validation rule picks per arm (``comparison.select``), then the
chosen configurations compared on test with the verdict table's paired statistics.

A setting is an arm's values of the swept keys other than ``arm_key`` and the seed (beta; a reset interval;
EMA's alpha). Per arm, the setting with the best mean final validation metric over its seeds wins, among those
whose validation floors hold; the verdict reads the test metric for the chosen settings alone. An arm tuned over more
settings is favoured by the maximum it takes, so the number tried per arm is stated and unequal budgets flagged.

Test is read from the very runs that won on validation, not from fresh seeds of the chosen setting, so it carries
a winner's curse: a run whose seed happened to help it on validation is likely helped on test too (the two splits
share the run's noise), and the maximum over settings picks such runs. The report says so, and estimates by how
much per arm (``optimism``, read after every choice is made, so no test number reaches a choice): the winner's mean
validation-minus-test gap above its runners-up's mean gap. The
validation excess is what selecting the maximum added on validation (the runners-up's gap measures the splits'
difference without selection); test shares at most that much of it, so it is an upper guide to the bias of the
test number, not a correction (Cawley & Talbot 2010, JMLR 11:2079, on selection bias in model selection).

With ``comparison.select.budget`` = N the rule reads the metric on the first N validation prompts only (prompt ids
0 .. N-1 of the validation split; the split is a random slice seeded by ``task.data_seed``, refexp/tasks/splits.py,
so they are one fixed random draw, the same rows for every run of the task whatever its training seed), from
each run's final per-prompt outcomes (``eval_outcomes.jsonl``, split ``val``): what a user of a learned reward who
could verify N prompts would choose on. A run without those outcomes, or with fewer than N validation prompts, makes
the whole choice refused (``Selection.refused``), never read on the full split instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from refexp.report.reading.comparison_plan import ComparisonPlan
from refexp.report.reading.load import Run
from refexp.report.reading.reduce import change_from_start
from refexp.report.statistics.frontier import Settings, common_settings, planned_runs, settings_of
from refexp.report.statistics.inference import Verdict, difference_bound, family_verdicts
from refexp.report.statistics.metric_scores import aligned, final_scores, final_value, paired_result


@dataclass
class Candidate:
    """One setting of one arm: its runs and the validation numbers the rule reads."""

    settings: Settings
    runs: list[Run]
    score: Optional[float]
    """Mean final value of the rule's metric over the runs that logged it (None: none did); with a budget, the mean
    over the runs of each run's mean final score on the budget's prompts."""
    floors: dict[str, Optional[float]]
    """Floor metric -> its mean final value (None: no run logged it; that floor is not applied)."""
    eligible: bool
    changes: dict[str, Optional[float]] = field(default_factory=dict)
    """Change-floor metric -> the mean of each run's final minus step-0 value (None: not measurable)."""

    @property
    def shown(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.settings) or "(no swept setting)"


@dataclass
class Choice:
    """An arm's candidates and the one chosen (None: no candidate was eligible and scored)."""

    arm: str
    candidates: list[Candidate]
    chosen: Optional[Candidate]
    optimism: Optional[float] = None
    """The chosen setting's mean final validation-minus-test gap minus its runners-up's mean gap (``optimism``);
    None without a runner-up that logged both."""


@dataclass
class Selection:
    """The rule, each arm's choice, the budgets, and the chosen configurations' test comparison."""

    rule: str
    choices: dict[str, Choice]
    baseline: str
    metric: str
    notes: list[str] = field(default_factory=list)
    results: dict[str, object] = field(default_factory=dict)
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    text: str = ""
    maximize: bool = True
    """Whether a higher metric is better (the rule's ``maximize``, for its test twin too)."""
    budget: Optional[int] = None
    """The validation prompts the rule reads (``comparison.select.budget``); None: the whole split."""
    refused: Optional[str] = None
    """Why no choice was made under the budget (runs without the budget's per-prompt outcomes); None: applied."""

    @property
    def budgets(self) -> dict[str, int]:
        """arm -> settings tried (with a completed run)."""
        return {arm: len(c.candidates) for arm, c in self.choices.items()}


def mean_final(runs: list[Run], metric: str) -> Optional[float]:
    values = [v for v in (final_value(r, metric) for r in runs) if v is not None]
    return float(np.mean(values)) if values else None


def best_of(scored: list[tuple[Candidate, float]], maximize: bool
            ) -> tuple[Optional[Candidate], Optional[float], list[str]]:
    """(the candidate with the best score, that score, the settings that tie with it): the first in ``scored``'s
    order wins a tie; (None, None, []) when nothing is scored."""
    if not scored:
        return None, None, []
    best, value = (max if maximize else min)(scored, key=lambda cs: cs[1])
    return best, value, [c.shown for c, v in scored if v == value]


def budget_score(run: Run, metric: str, budget: int) -> Optional[float]:
    """The run's mean final ``metric`` score on validation prompts 0 .. budget-1 (``final_scores``); None when its
    final evaluation has no per-prompt scores or lacks one of those prompts."""
    scores = final_scores(run, metric)
    if scores is None or any(i not in scores for i in range(budget)):
        return None
    return float(np.mean([scores[i] for i in range(budget)]))


def budget_change(run: Run, metric: str, budget: int) -> Optional[float]:
    """The run's final minus step-0 mean ``metric`` score on validation prompts 0 .. budget-1; None without
    per-prompt scores for each of them at both evaluations."""
    final, start = final_scores(run, metric), run.outcomes_of(metric).get(0)
    if final is None or start is None or any(i not in final or i not in start for i in range(budget)):
        return None
    return float(np.mean([final[i] - start[i] for i in range(budget)]))


def _budget_mean(runs: list[Run], metric: str, budget: int, read=budget_score) -> Optional[float]:
    values = [read(r, metric, budget) for r in runs]
    return None if any(v is None for v in values) or not values else float(np.mean(values))


def refusal(runs: list[Run], select: dict) -> Optional[str]:
    """Why the budget cannot be applied to ``runs`` (the declared arms' runs), or None when every one has the
    per-prompt scores on the budget's prompts of the rule's metric and floors (final; the change floors' at step 0
    too)."""
    budget = select["budget"]
    reads = [(select["metric"], budget_score, "final evaluation")]
    reads += [(k, budget_score, "final evaluation") for k in select.get("floor") or {}]
    reads += [(k, budget_change, "step-0 and final evaluations") for k in select.get("floor_change") or {}]
    for metric, read, when in reads:
        lacking = sorted(r.name for r in runs if read(r, metric, budget) is None)
        if lacking:
            shown = ", ".join(lacking[:3]) + (f" and {len(lacking) - 3} more" if len(lacking) > 3 else "")
            return (f"No tuned comparison: comparison.select.budget asks for {metric} on the first {budget} "
                    f"validation prompts, and {len(lacking)} of {len(runs)} runs have no per-prompt {metric} score "
                    f"for each of them at their {when} (eval_outcomes.jsonl, split val; runs written before it was "
                    f"recorded, or measured on fewer prompts): {shown}. No setting is chosen; the full validation "
                    f"split is not read in the budget's place.")
    return None


def _mean_change(runs: list[Run], metric: str) -> Optional[float]:
    """The mean over runs of the metric's last logged value minus its step-0 value (``reduce.change_from_start``),
    over the runs that logged it at step 0 and later."""
    changes = [change_from_start(r, metric) for r in runs if _logged_from_step_0(r, metric)]
    return float(np.mean(changes)) if changes else None


def _logged_from_step_0(run: Run, metric: str) -> bool:
    steps, _ = run.series(metric)
    return len(steps) >= 2 and int(steps[0]) == 0


def rule_text(select: dict) -> str:
    """The rule in words, as the setup block states it."""
    floor = select.get("floor") or {}
    text = (f"per arm, the setting with the {'highest' if select.get('maximize', True) else 'lowest'} mean final "
            f"{select['metric']} over its seeds")
    conditions = [f"mean final {k} >= {v:g}" for k, v in floor.items()]
    conditions += [f"mean change of {k} from step 0 >= {v:+g}" for k, v in (select.get("floor_change") or {}).items()]
    if conditions:
        text += " among those with " + " and ".join(conditions)
    budget = select.get("budget")
    if budget is not None:
        text += (f", read on the first {budget} validation prompts only, ids 0-{budget - 1} of the validation split "
                 f"(one fixed draw seeded by task.data_seed, the same prompts for every run: a labelled budget a user "
                 f"could afford" + ("; the floors read the same prompts)" if conditions else ")"))
    return text + "; test read for the chosen settings only"


def compared_metric(select_metric: str) -> str:
    """The test twin of a validation metric (``val/gold`` -> ``eval/gold``): what an arm tuned on validation is
    compared on, so the verdict measures on unseen prompts the quantity the tuning chose for."""
    return "eval/" + select_metric[len("val/"):]


def choose(runs: list[Run], plan: ComparisonPlan) -> Optional[Selection]:
    """Each declared arm's chosen setting under the block's ``select`` rule; None when the block declares none."""
    block = plan.block or {}
    select = block.get("select") or {}
    if not select.get("metric"):
        return None
    metric, maximize, floor = select["metric"], bool(select.get("maximize", True)), dict(select.get("floor") or {})
    floor_change = dict(select.get("floor_change") or {})
    budget = select.get("budget")
    sel = Selection(rule_text(select), {}, str(plan.baseline), compared_metric(metric), maximize=maximize,
                    budget=budget)
    by_arm: dict[str, dict[Settings, list[Run]]] = {}
    planned = planned_runs(runs, plan)
    common = common_settings(planned)
    for r in planned:
        by_arm.setdefault(plan.arm(r), {}).setdefault(settings_of(r, block["arm_key"], common), []).append(r)
    if budget is not None:
        sel.refused = refusal([r for arm in block["arms"] for rs in by_arm.get(arm, {}).values() for r in rs],
                              select)
    unlogged = set()
    for arm in block["arms"]:
        cands = []
        for settings, rs in sorted(by_arm.get(arm, {}).items()):
            if budget is None:
                floors = {k: mean_final(rs, k) for k in floor}
                changes = {k: _mean_change(rs, k) for k in floor_change}
            else:  # the floors read the budget's prompts too: a user has no more validation labels for them
                floors = {k: _budget_mean(rs, k, budget) for k in floor}
                changes = {k: _budget_mean(rs, k, budget, budget_change) for k in floor_change}
            unlogged |= {k for k, v in (*floors.items(), *changes.items()) if v is None}
            ok = (all(v is None or v >= floor[k] for k, v in floors.items())
                  and all(v is None or v >= floor_change[k] for k, v in changes.items()))
            score = (None if sel.refused else _budget_mean(rs, metric, budget) if budget is not None
                     else mean_final(rs, metric))
            cands.append(Candidate(settings, rs, score, floors, ok, changes))
        best, _, tied = best_of([(c, c.score) for c in cands if c.eligible and c.score is not None], maximize)
        if len(tied) > 1:
            sel.notes.append(f"{arm}: {', '.join(tied)} tie on {metric}; the first in setting order is chosen")
        sel.choices[arm] = Choice(arm, cands, best)
    for c in sel.choices.values():  # after every choice: the runners-up's test numbers never reach one
        c.optimism = optimism(c, sel.metric)
    if unlogged:
        sel.notes.append(f"floor on {', '.join(sorted(unlogged))} not applied where no run logged it")
    budgets = set(sel.budgets.values())
    if len(budgets) > 1:
        sel.notes.append("unequal tuning budgets (" + ", ".join(f"{a} {n}" for a, n in sel.budgets.items())
                         + " settings tried): an arm tuned over more settings is favoured by its selection")
    if sel.refused:
        sel.notes.append(sel.refused)
        sel.text = sel.refused
        return sel
    for arm, c in sel.choices.items():
        if c.chosen is None:
            sel.notes.append(f"{arm}: no setting {'met the floor' if c.candidates else 'completed'}; not compared")
    _compare(sel, plan)
    return sel


def gap(c: Candidate, test_metric: str) -> Optional[float]:
    """The candidate's validation score (what the rule read: the whole split or the budget's prompts) minus its mean
    final ``test_metric`` (None: one is not logged)."""
    test = mean_final(c.runs, test_metric)
    return None if c.score is None or test is None else c.score - test


def optimism(choice: Choice, test_metric: str) -> Optional[float]:
    """The winner's validation-minus-test gap above the mean gap of the arm's other settings that logged both
    (module doc); None without a winner or a runner-up."""
    if choice.chosen is None:
        return None
    won = gap(choice.chosen, test_metric)
    others = [g for g in (gap(c, test_metric) for c in choice.candidates if c is not choice.chosen)
              if g is not None]
    return None if won is None or not others else won - float(np.mean(others))


def curse_text(sel: Selection) -> str:
    """The sentence that says test comes from the runs that won on validation, and the per-arm optimism."""
    budgets = ", ".join(f"{a} {n}" for a, n in sel.budgets.items())
    est = [f"{a} {c.optimism:+.3f}" for a, c in sel.choices.items() if c.optimism is not None]
    none = [a for a, c in sel.choices.items() if c.chosen is not None and c.optimism is None]
    text = (f"Test is read from the runs that won on validation, not from fresh seeds of the chosen settings "
            f"(settings searched per arm: {budgets}), so each arm's test number is biased upward by the selection "
            f"wherever validation and test share a run's noise.")
    if est:
        text += (" The winner's validation-minus-test gap above its runners-up', an upper guide to that bias: "
                 + ", ".join(est) + ".")
    if none:
        text += f" Not estimable without a runner-up: {', '.join(none)}."
    return text


def _compare(sel: Selection, plan: ComparisonPlan) -> None:
    """Every chosen arm against the chosen baseline on the block's test metric, paired by SFT start, seed and
    prompt."""
    base = sel.choices.get(sel.baseline)
    if base is None or base.chosen is None:
        sel.text = f"No tuned comparison: the baseline {sel.baseline} has no chosen setting."
        return
    base_runs = {(r.sft_start, r.seed): r for r in base.chosen.runs}
    for arm, c in sel.choices.items():
        if arm == sel.baseline or c.chosen is None:
            continue
        per_unit = {}
        for r in c.chosen.runs:
            unit = (r.sft_start, r.seed)
            b = base_runs.get(unit)
            va, vb = (final_value(r, sel.metric), final_value(b, sel.metric)) if b else (None, None)
            if va is None or vb is None:
                continue
            got = aligned([final_scores(r, sel.metric), final_scores(b, sel.metric)])
            if got is None:
                per_unit[unit] = (None, None, va - vb, [])
            else:
                sa, sb = got[1]
                per_unit[unit] = (sa, sb, float(sa.mean() - sb.mean()), got[0])
        sel.results[f"{arm} ({c.chosen.shown})"] = paired_result(per_unit)
    sel.verdicts = family_verdicts({k: v for k, v in sel.results.items() if v is not None}, alpha=plan.alpha,
                                   margin=plan.margin, bound=difference_bound(sel.metric))
    label = f"{sel.baseline} ({base.chosen.shown})"
    n = len(sel.verdicts)
    parts = [f"Each arm at its best ({sel.rule}): final {sel.metric}, paired against {label}. Family: {n} "
             f"comparison{'s' * (n != 1)}, Holm-adjusted, alpha {plan.alpha:g}."]
    parts += [v.sentence(sel.baseline) for v in sel.verdicts.values()]
    unclaimed = [k for k, v in sel.results.items() if v is None]
    if unclaimed:
        parts.append("No claim (fewer than 2 paired seeds): " + "; ".join(unclaimed) + ".")
    sel.text = " ".join(parts + [curse_text(sel)])
