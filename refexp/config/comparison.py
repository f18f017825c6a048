"""The root's ``comparison`` block: the comparison an experiment was planned for, declared before it runs.

A sweep's report (``refexp-report``, and the sweep callback ``refexp/cli/sweep.py``) reads it from the runs'
``resolved_config.yaml``: the verdict pairs these arms against this baseline over these seeds only; runs
outside it are listed and left out. An empty block (no ``arms``) declares nothing: the report is then
exploratory and needs ``refexp-report --baseline``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from .errors import check

PRIMARY_METRICS = ("eval/accuracy", "eval/retention", "eval/gold")
"""Metrics a primary contrast can be tested on: the registered held-out (test) metrics each evaluation records per
prompt (``eval_outcomes.jsonl``, ``refexp/record/metric_names.py``), at their final value (the report's
``PRIMARY_ENDPOINTS``, ``refexp/report/reading/comparison_plan.py``)."""

COMPARED_METRICS = PRIMARY_METRICS
"""Metrics ``comparison.metric`` can name: the headline, compared at its final value and at each of ``at_steps``.
The same held-out metrics, since the report pairs arms on their per-prompt outcomes; a ``val/`` metric chooses
(``comparison.select``) and is never compared, and a training metric has no held-out prompts to pair on."""

MAX_PRIMARY = 3
"""At most this many primary contrasts: each one more divides Holm's first step's alpha again, and a question with
more than three answers is several questions."""


SEED_KEY = "training.seed"
"""The swept key a comparison pairs by; never an arm's hyper-parameter."""


@dataclass
class SelectionConfig:
    """How the report picks each arm's hyper-parameters (``comparison.select``): per arm, among the settings of
    the swept keys other than ``arm_key`` and the seed, the one with the best mean of ``metric`` over its seeds,
    among those whose validation metrics meet every ``floor``. Only validation metrics choose; the test metric
    is read for the chosen settings alone."""

    metric: str = ""
    """The validation metric a setting is chosen on (its final value, averaged over the setting's seeds):
    a ``val/`` metric (val/accuracy), never a test one; empty: no tuned comparison."""
    maximize: bool = True
    """Whether a higher ``metric`` is better."""
    floor: dict[str, float] = field(default_factory=dict)
    """Validation metric -> the least mean final value a setting must reach to be eligible (e.g.
    ``{val/retention: 0.8}``); a floor on a metric the runs do not log is not applied and the report says so."""
    floor_change: dict[str, float] = field(default_factory=dict)
    """Validation metric -> the least mean change of its final value from each run's step-0 value a setting must
    reach (e.g. ``{val/retention: -0.1}``: lose at most 0.1 of what the start had). Read per run, so SFT starts
    that begin at different levels are held to one rule, where an absolute ``floor`` averaged over them may be out of
    reach; not applied to a metric the runs do not log at step 0 and at the end, and the report says so."""
    budget: Optional[int] = None
    """Choose on the first ``budget`` validation prompts only (prompt ids 0 .. budget-1 of the validation split, a
    random slice seeded by ``task.data_seed``: one fixed draw, the same rows for every run): the gold labels a user
    of a learned reward could afford (e.g. 50 verified prompts), read from each run's final per-prompt ``metric``
    outcomes (``eval_outcomes.jsonl``, split ``val``). Runs without them, or with fewer validation prompts, make the
    report refuse the choice (never the full split instead). The floors read the same prompts (``floor_change``:
    their final minus step-0 scores), and runs without those per-prompt scores refuse the choice too. None: the
    whole validation split (``eval.num_prompts`` prompts)."""

    @property
    def declared(self) -> bool:
        """Whether a selection rule is set (it names a metric)."""
        return bool(self.metric)

    def __post_init__(self) -> None:
        check(self.metric == "" or self.metric.startswith("val/"), "comparison.select.metric", self.metric,
              "a validation metric (val/accuracy), or empty: choosing on a test metric biases the comparison")
        check(self.budget is None or (isinstance(self.budget, int) and not isinstance(self.budget, bool)
                                      and self.budget >= 1),
              "comparison.select.budget", self.budget,
              "a whole number of validation prompts >= 1 (50: the first 50 verified prompts), or null: the whole split")
        check(self.budget is None or self.declared, "comparison.select.budget", self.budget,
              "null without comparison.select.metric (the validation metric the budget's prompts are scored on)")
        for key, value in self.floor.items():
            check(isinstance(key, str) and key.startswith("val/"), "comparison.select.floor", key,
                  "validation metrics as keys (val/retention)")
            check(isinstance(value, (int, float)) and not isinstance(value, bool), f"comparison.select.floor.{key}",
                  value, "a number")
        for key, value in self.floor_change.items():
            check(isinstance(key, str) and key.startswith("val/"), "comparison.select.floor_change", key,
                  "validation metrics as keys (val/retention)")
            check(isinstance(value, (int, float)) and not isinstance(value, bool),
                  f"comparison.select.floor_change.{key}", value, "a number (a change: -0.1 loses at most 0.1)")


MATCHED_AXES = ("kl/init", "eval/retention", "kl/init_exact")
"""What a declared matched contrast can match on: the drift from the start (on a log axis) as the k3 estimate
``kl/init`` or the exact per-position KL ``kl/init_exact`` (the same samples without the sampled tokens' noise,
``refexp/components/evaluation.py``), or the retained skill (``refexp/report/statistics/frontier.py``'s axes)."""
DRIFT_AXES = ("kl/init", "kl/init_exact")
"""The matched axes that are a drift: read in log, any value > 0."""
MATCHED_ALONG = ("axis", "key")
"""How ``comparison.matched`` reads a replicate's curve at a value: ``axis`` (its runs sorted by the matched axis,
the two nearest the value) or ``key`` (its runs walked along the frontier key, the neighbours that cross it)."""
MATCHED_ESTIMANDS = ("frontier", "crossing")
"""What a declared matched contrast estimates: ``frontier`` (each arm's curve of final points across the frontier key
read at the value) or ``crossing`` (each run read where its drift first passes the value, between two of its
evaluations); the default first."""


@dataclass
class MatchedConfig:
    """Primary contrasts at matched drift (``comparison.matched``): with a ``frontier_key``, each arm of
    ``comparison.primary`` is compared with the baseline's frontier at each declared value of ``axis``, fixed
    before the runs, instead of at points the report picks from the data. Per replicate (SFT start, seed) each arm's
    curve across the frontier key is interpolated at the value; a value outside the drift a replicate's runs
    reached makes no claim (never extrapolated). Empty ``at``: no matched primary contrast."""

    axis: str = "kl/init"
    """The final metric the arms are matched on: ``kl/init`` (drift from the start, interpolated in log),
    ``kl/init_exact`` (the same drift measured without the sampled tokens' noise, in log) or ``eval/retention`` (the
    retained skill, interpolated linearly)."""
    at: list[float] = field(default_factory=list)
    """The values of ``axis`` each primary contrast is tested at (e.g. ``[0.06]``): inside the range every arm's
    beta grid is expected to reach, chosen from a pilot before the runs."""
    along: str = "axis"
    """Which two runs a replicate's curve is read between: ``axis``, the two whose final ``axis`` lie nearest the
    value on either side (the curve as a function of drift); ``key``, the two neighbours on the frontier key's grid
    whose final ``axis`` straddle it (the crossing at the largest key where there are several). They differ where the
    drift is not monotone in the key: kl/init stops growing once a policy answers every prompt the same way (it is
    then -log of the start's probability of those answers), so a larger beta can end at more drift than a smaller
    one, and sorted by drift two betas far apart sit side by side. The secondary matched tables read the same way."""
    max_gap: Optional[float] = None
    """The widest step on ``axis`` between the two runs a replicate's curve is read between: a ratio (larger /
    smaller, > 1) on a drift axis, read in log; a difference (> 0) on ``eval/retention``, read linearly. A value
    whose runs on either side lie farther apart makes no claim in that replicate: the chord across a wide step
    misplaces a curve that bends (a gold reward that peaks, then falls with drift). ``frontier_gap`` still bounds
    the two runs' frontier-key values. It applies to every reading on ``axis``: the primary contrasts and the
    secondary matched table on that axis (not the one on the other axis). None: no bound on the axis."""
    estimand: str = "frontier"
    """What the primary contrasts estimate at each value of ``at``: ``frontier``, each replicate's curve of its runs'
    final points across the frontier key read at the value (the rules above); ``crossing``, each run read where its
    drift (a drift ``axis``) first passes the value between two of its evaluations after step 0, interpolated in log
    drift, and per replicate an arm's value the mean over its runs that pass it: policies part-way through their
    runs, at whatever beta reached the drift (``refexp/report/statistics/trajectory_crossing.py``). The gap rules
    (``max_gap``, ``frontier_gap``) and ``along`` read across runs and do not apply to ``crossing``; a replicate in
    which no run of an arm passes the value makes no claim."""

    grids: dict[str, list[Any]] = field(default_factory=dict)
    """Arm -> the frontier-key values (betas) its sweep runs, declared with the design: the design step
    (``refexp-report --plan``) simulates the design on these grids rather than the pilot's, and the experiment's
    launch script runs them (a test holds the two equal). An arm not named is simulated on the pilot's grid. The
    report reads whatever runs there are; a grid is the plan's, not a filter."""

    @property
    def declared(self) -> bool:
        """Whether matched primary contrasts are declared (values to match at)."""
        return bool(self.at)

    def __post_init__(self) -> None:
        check(self.axis in MATCHED_AXES, "comparison.matched.axis", self.axis, " or ".join(MATCHED_AXES))
        check(self.estimand in MATCHED_ESTIMANDS, "comparison.matched.estimand", self.estimand,
              " or ".join(MATCHED_ESTIMANDS))
        check(self.estimand != "crossing" or self.axis in DRIFT_AXES, "comparison.matched.estimand", self.estimand,
              f"frontier on {self.axis} (crossing reads where a run's drift, " + " or ".join(DRIFT_AXES)
              + ", first passes the value)")
        check(self.along in MATCHED_ALONG, "comparison.matched.along", self.along, " or ".join(MATCHED_ALONG))
        low, high = (0.0, float("inf")) if self.axis in DRIFT_AXES else (0.0, 1.0)
        check(all(isinstance(x, (int, float)) and not isinstance(x, bool) and low < x < high for x in self.at)
              and len(set(self.at)) == len(self.at), "comparison.matched.at", self.at,
              f"distinct values of {self.axis} in ({low:g}, {high:g}) to compare at, or empty")
        for arm, grid in self.grids.items():
            check(isinstance(grid, (list, tuple)) and len(grid) >= 2 and len(set(grid)) == len(grid)
                  and all(isinstance(b, (int, float)) and not isinstance(b, bool) and b > 0 for b in grid),
                  f"comparison.matched.grids.{arm}", grid,
                  "a list of two or more distinct frontier-key values > 0 (the betas the arm's sweep runs)")
        least = 1.0 if self.axis in DRIFT_AXES else 0.0
        check(self.max_gap is None or (isinstance(self.max_gap, (int, float)) and not isinstance(self.max_gap, bool)
                                       and math.isfinite(self.max_gap) and self.max_gap > least),
              "comparison.matched.max_gap", self.max_gap,
              f"a ratio > 1 on the drift axis {self.axis} (2: the two runs a curve is read between lie within a "
              f"factor 2), or null" if self.axis in DRIFT_AXES else
              f"a difference > 0 on {self.axis} (0.1: the two runs a curve is read between lie within 0.1), or null")


@dataclass
class ComparisonConfig:
    """The pre-registered comparison: which runs a verdict is about and what it compares. Set in an experiment
    file (``conf/experiment/*.yaml``); empty (no arms) everywhere else."""

    arm_key: str = ""
    """The swept override whose value names a run's arm (``grpo_variant``, ``dpo_variant``, ``reference``)."""
    arms: list[str] = field(default_factory=list)
    """The values of ``arm_key`` the comparison is about; empty: no comparison declared."""
    baseline: str = ""
    """The arm every other arm is paired against (one of ``arms``)."""
    seeds: list[int] = field(default_factory=list)
    """The ``training.seed`` values planned; runs of other seeds are listed and left out of the verdict."""
    metric: str = "eval/accuracy"
    """The headline metric compared (its final value, and its value at each of ``at_steps``): a held-out metric
    logged at the end with per-prompt outcomes (``COMPARED_METRICS``: eval/accuracy, eval/retention, eval/gold;
    under a learned reward ``eval/gold`` is the gold reward and ``eval/accuracy`` the proxy). The report's tables,
    first screen, frontier and power plan (``refexp-report --plan``) read it; with ``metrics`` empty the primary
    contrasts are tested on it alone."""
    primary: list[str] = field(default_factory=list)
    """The primary contrasts, one to ``MAX_PRIMARY`` arms other than the baseline, each meaning arm - baseline on
    ``metrics``: the verdict's family (Holm runs over these alone, all metrics together), the only comparisons the
    report's summary claims anything of; every other comparison is secondary. With ``matched.at`` set, each is
    instead arm - the baseline's frontier at each declared matched value. Empty: none declared, every comparison is
    secondary."""
    metrics: list[str] = field(default_factory=list)
    """The metrics the primary contrasts are tested on (their final values), each of ``PRIMARY_METRICS``; empty:
    ``[metric]``."""
    equivalence_margin: Optional[float] = None
    """The margin m of "equivalent within ±m" (two one-sided tests), in the metric's units, declared before the
    runs; None: no claim of no difference is made (``refexp-report --equivalence-margin`` sets one, post hoc)."""
    at_steps: list[int] = field(default_factory=list)
    """Steps at which the metric is compared too (``refexp-report --at-steps``)."""
    chosen_on_test: list[str] = field(default_factory=list)
    """Hyper-parameters (dotted keys) chosen by looking at test accuracy, not validation: the report's setup
    block names them, since they favour the arms they were tuned for."""
    frontier_key: str = ""
    """A swept key varied within every arm (``algo.beta``): the report draws each arm's accuracy against its
    drift (``kl/init``) across this key's values, and compares arms at matched drift; empty: no frontier."""
    frontier_gap: Optional[float] = None
    """The widest ratio (larger / smaller) of ``frontier_key`` values between the two runs a matched point is
    interpolated between; a point across a wider gap is "not matched" (refexp/report/statistics/frontier.py).
    None: its ``DEFAULT_FRONTIER_GAP`` (2.5)."""
    matched: MatchedConfig = field(default_factory=MatchedConfig)
    """The primary contrasts at declared values of drift (or retention) on the frontier (``matched.at`` empty:
    the primary contrasts are group-by-group final values)."""
    select: SelectionConfig = field(default_factory=SelectionConfig)
    """The rule that picks each arm's best hyper-parameters on validation, then compared on test (its metric
    empty: the report makes no tuned comparison)."""

    @property
    def declared(self) -> bool:
        """Whether this block declares a comparison (it has arms)."""
        return bool(self.arms)

    def __post_init__(self) -> None:
        check(self.metric in COMPARED_METRICS, "comparison.metric", self.metric,
              "a held-out metric the report compares per prompt, one of " + ", ".join(COMPARED_METRICS)
              + " (a val/ metric chooses in comparison.select, a training metric is not held out)")
        if not self.arms:
            for name in ("primary", "metrics"):
                check(not getattr(self, name), f"comparison.{name}", getattr(self, name),
                      "empty without comparison.arms (declare the arms, baseline and seeds first)")
            return
        check(bool(self.arm_key), "comparison.arm_key", self.arm_key, "the swept key naming the arms (grpo_variant)")
        check(len(set(self.arms)) == len(self.arms), "comparison.arms", self.arms, "distinct arm names")
        check(self.baseline in self.arms, "comparison.baseline", self.baseline,
              "one of comparison.arms (" + ", ".join(self.arms) + ")")
        check(len(self.arms) >= 2, "comparison.arms", self.arms, "at least the baseline and one other arm")
        check(bool(self.seeds) and all(isinstance(s, int) and s >= 0 for s in self.seeds), "comparison.seeds",
              self.seeds, "a non-empty list of seeds >= 0")
        others = [a for a in self.arms if a != self.baseline]
        check(all(a in others for a in self.primary) and len(set(self.primary)) == len(self.primary),
              "comparison.primary", self.primary,
              "distinct arms other than the baseline (" + ", ".join(others) + "), each meaning arm - baseline")
        check(len(self.primary) <= MAX_PRIMARY, "comparison.primary", self.primary,
              f"one to {MAX_PRIMARY} arms (every other comparison is secondary)")
        check(all(m in PRIMARY_METRICS for m in self.metrics) and len(set(self.metrics)) == len(self.metrics),
              "comparison.metrics", self.metrics, "distinct metrics among " + ", ".join(PRIMARY_METRICS)
              + ", or empty (comparison.metric alone)")
        check(self.equivalence_margin is None or (isinstance(self.equivalence_margin, (int, float))
                                                  and not isinstance(self.equivalence_margin, bool)
                                                  and self.equivalence_margin > 0),
              "comparison.equivalence_margin", self.equivalence_margin,
              "a number > 0 in the metric's units (0.05 for accuracy), or null: no equivalence claim")
        check(self.frontier_key not in (self.arm_key, SEED_KEY), "comparison.frontier_key", self.frontier_key,
              "a swept key other than comparison.arm_key and the seed (algo.beta), or empty")
        check(self.frontier_gap is None or self.frontier_gap > 1, "comparison.frontier_gap", self.frontier_gap,
              "a ratio > 1 (2.5: runs at beta 1 and 0.4 bridge a matched point, 1 and 0.2 do not), or null")
        check(all(isinstance(s, int) and s >= 0 for s in self.at_steps), "comparison.at_steps", self.at_steps,
              "steps >= 0")
        if self.matched.declared:
            check(bool(self.frontier_key), "comparison.matched.at", self.matched.at,
                  "empty without comparison.frontier_key (the swept key, e.g. algo.beta, each arm's curve runs along)")
            check(bool(self.primary), "comparison.matched.at", self.matched.at,
                  "empty without comparison.primary (the arms tested against the baseline's frontier)")
            unknown = [a for a in self.matched.grids if a not in self.arms]
            check(not unknown, "comparison.matched.grids", unknown,
                  f"arms among comparison.arms ({', '.join(self.arms)})")
            family = len(self.primary) * len(self.metrics or [self.metric]) * len(self.matched.at)
            check(family <= MAX_PRIMARY, "comparison.matched.at", self.matched.at,
                  f"few enough values that primary x metrics x values is at most {MAX_PRIMARY} (here {family})")
