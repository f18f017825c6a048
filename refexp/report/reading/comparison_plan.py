"""Which runs a verdict is about: the comparison the experiment declared (its ``comparison`` block, read from the
runs' ``resolved_config.yaml``), or an exploratory one against ``--baseline`` or ``default_baseline``'s.

Runs outside the declared seeds or arms, and runs from another refexp commit or thread count than the majority
of the sweep's completed runs, are listed (``ComparisonPlan.excluded``) and left out of the verdict unless
``--allow-mixed``. The baseline is the declared block's, else ``--baseline``; an ad-hoc sweep that names neither
(``refexp -m reference=fixed,none ...``) is compared against ``fixed`` where a group is that, else its first
group (``default_baseline``), and the report says which and why: every such report is exploratory.

A declared block's ``primary`` arms are the verdict's family (``ComparisonPlan.role``); every other comparison is
secondary. A block the report cannot read (``block_problem``: no ``arm_key``, a baseline outside the arms, ...) is
one note and an exploratory report, never an exception.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from refexp.record.status import provenances
from refexp.report.reading.group import group_runs
from refexp.report.reading.load import Run, _get
from refexp.report.reading.reduce import FINAL_COLUMNS

PRIMARY_ENDPOINTS = FINAL_COLUMNS
"""A primary metric -> the key of its final value's endpoint (``statistics/summary.py``'s ``endpoints``); the metrics
``refexp/config/comparison.py`` accepts in ``comparison.metrics`` (``PRIMARY_METRICS``) and in ``comparison.metric``
(``COMPARED_METRICS``, the same held-out metrics)."""
DEFAULT_METRIC = "eval/accuracy"
"""The headline without a declared block, and of a block written before ``comparison.metric`` existed."""
MAX_PRIMARY = 3
"""As ``refexp/config/comparison.py``'s: the most primary contrasts a block declares."""
MATCHED_AXES = ("kl/init", "eval/retention", "kl/init_exact")
"""As ``refexp/config/comparison.py``'s: what ``comparison.matched.axis`` may name, its default first."""
MATCHED_ALONG = ("axis", "key")
"""As ``refexp/config/comparison.py``'s: what ``comparison.matched.along`` may name, its default first."""
MATCHED_ESTIMANDS = ("frontier", "crossing")
"""As ``refexp/config/comparison.py``'s: what ``comparison.matched.estimand`` may name, its default first."""
DRIFT_AXES = ("kl/init", "kl/init_exact")
"""As ``refexp/config/comparison.py``'s: the matched axes that are a drift (the ``crossing`` estimand's)."""

VARIANT_KEYS = ("grpo_variant", "dpo_variant", "reference")
"""Swept keys whose value an exploratory ``--baseline`` may name (``--baseline fixed`` for ``dpo_variant=fixed``)."""


@dataclass
class ComparisonPlan:
    """The comparison of one report and the runs it reads."""

    block: Optional[dict]
    """The declared ``comparison`` block (None: the sweep declares none, the report is exploratory)."""
    baseline: Optional[str]
    """The declared baseline arm, else ``--baseline``, else ``default_baseline``'s."""
    alpha: float = 0.05
    margin: Optional[float] = None
    """Equivalence margin (``--equivalence-margin``, else the declared block's ``equivalence_margin``); None: no
    claim of no difference is made."""
    allow_mixed: bool = False
    excluded: dict[str, str] = field(default_factory=dict)
    """run name -> why it is left out of the verdict (or, with ``allow_mixed``, why it would have been)."""
    notes: list[str] = field(default_factory=list)
    baseline_why: str = "declared"
    """Where an exploratory report's baseline comes from: ``--baseline``, or why ``default_baseline`` chose it."""
    problem: str = ""
    """Why the runs' comparison block could not be read (the report is then exploratory); empty: none."""

    @property
    def primary(self) -> list[str]:
        """The declared primary contrasts (arms, each against the baseline); empty without a block or without
        ``comparison.primary``: every comparison is secondary (exploratory without a block)."""
        return [str(a) for a in (self.block or {}).get("primary") or ()]

    @property
    def metric(self) -> str:
        """The headline metric: the declared ``comparison.metric`` (one of ``PRIMARY_ENDPOINTS``: ``block_problem``
        checked it), else ``DEFAULT_METRIC``."""
        return str((self.block or {}).get("metric") or DEFAULT_METRIC)

    @property
    def primary_metrics(self) -> list[str]:
        """The metrics the primary contrasts are tested on: ``comparison.metrics``, else ``[comparison.metric]``."""
        return [str(m) for m in (self.block or {}).get("metrics") or ()] or [self.metric]

    @property
    def matched_at(self) -> tuple[str, tuple[float, ...]]:
        """``matched_of`` the declared block."""
        return matched_of(self.block or {})

    @property
    def matched_along(self) -> str:
        """``comparison.matched.along`` of the declared block (a block written before it: ``axis``)."""
        return str(((self.block or {}).get("matched") or {}).get("along") or MATCHED_ALONG[0])

    @property
    def matched_estimand(self) -> str:
        """``comparison.matched.estimand`` of the declared block (checked by ``block_problem``; a block written before
        it: ``frontier``)."""
        return str(((self.block or {}).get("matched") or {}).get("estimand") or MATCHED_ESTIMANDS[0])

    @property
    def max_gap(self) -> Optional[float]:
        """``comparison.matched.max_gap`` of the declared block (checked by ``block_problem``): the widest step on the
        matched axis (``matched_at``'s) between the two runs a curve is read between; None: no bound (a block
        written before it, or none declared)."""
        value = ((self.block or {}).get("matched") or {}).get("max_gap")
        return None if value is None else float(value)

    def role(self, arm: Optional[str]) -> str:
        """"primary" for a declared primary contrast's arm, else "secondary" (a declared block) or "exploratory"."""
        if not self.declared:
            return "exploratory"
        return "primary" if arm is not None and arm in self.primary else "secondary"

    @property
    def declared(self) -> bool:
        return self.block is not None

    @property
    def kind(self) -> str:
        """How the report labels the comparison."""
        if self.declared:
            return "pre-registered in the experiment config (its comparison block)"
        return "exploratory: not pre-registered"

    @property
    def at_steps(self) -> tuple[int, ...]:
        return tuple(int(s) for s in (self.block or {}).get("at_steps") or ())

    @property
    def chosen_on_test(self) -> list[str]:
        return [str(k) for k in (self.block or {}).get("chosen_on_test") or ()]

    def counts(self, run: Run) -> bool:
        """Whether ``run`` (a completed one) enters the verdict."""
        return self.allow_mixed or run.name not in self.excluded

    def arm(self, run: Run) -> Optional[str]:
        """The run's arm: its value of the block's ``arm_key`` (None without a block)."""
        return run.override(self.block["arm_key"]) if self.block else None

    def is_baseline(self, runs: list[Run], label: str) -> bool:
        """Whether a group (its runs and label) is the baseline: by the declared arm, else by the exploratory
        baseline (``--baseline`` or ``default_baseline``'s) naming its label or its swept variant value
        (``match_baseline`` makes sure only one group matches)."""
        if self.baseline is None:
            return False
        if self.declared:
            return any(self.arm(r) == self.baseline for r in runs)
        return label == self.baseline or any(r.override(k) == self.baseline for r in runs for k in VARIANT_KEYS)


DEFAULT_BASELINE = "fixed"
"""An ad-hoc sweep's baseline where one of its groups is this strategy or variant: the usual reference."""


def default_baseline(runs: list[Run]) -> tuple[str, str]:
    """(the baseline of a sweep that declares none and names none, why): ``DEFAULT_BASELINE`` where a run's
    swept variant (``VARIANT_KEYS``) is that, else the label of the first group in the report's order."""
    if any(r.override(k) == DEFAULT_BASELINE for r in runs for k in VARIANT_KEYS):
        return DEFAULT_BASELINE, f"no comparison declared, no --baseline named: a group is {DEFAULT_BASELINE}"
    first = next(iter(group_runs(runs).values()))[0]
    return first.label, f"no comparison declared, no --baseline named, no group is {DEFAULT_BASELINE}: the first group"


def matched_of(block: dict) -> tuple[str, tuple[float, ...]]:
    """(axis, values) of a comparison block's ``matched``: where the primary contrasts are tested on the baseline's
    frontier (checked by ``block_problem``); values empty: the primary contrasts are group by group."""
    m = block.get("matched") or {}
    return str(m.get("axis") or MATCHED_AXES[0]), tuple(float(x) for x in m.get("at") or ())


def declared_block(runs: list[Run]) -> tuple[Optional[dict], list[str]]:
    """The comparison block the runs' configs declare (one with arms), the most common one when they differ;
    with a note then."""
    blocks = [b for b in (_get(r.config, "comparison") for r in runs) if isinstance(b, dict) and b.get("arms")]
    if not blocks:
        return None, []
    counted = Counter(repr(sorted(b.items())) for b in blocks)
    top, n = counted.most_common(1)[0]
    block = next(b for b in blocks if repr(sorted(b.items())) == top)
    notes = [] if len(counted) == 1 else [f"the runs declare {len(counted)} different comparison blocks; the "
                                          f"report reads the one {n} of {len(blocks)} runs declare"]
    return block, notes


def block_problem(block: dict) -> Optional[str]:
    """What makes a declared block (one with arms) unusable, in one phrase naming the field and what would be
    valid; None when the report can read it. ``refexp/config/comparison.py`` refuses such a block before a run
    starts; this is for runs whose ``resolved_config.yaml`` holds one anyway (written by an older refexp, edited)."""
    arms = block.get("arms")
    if not isinstance(arms, list) or len(arms) < 2:
        return f"comparison.arms={arms!r} is invalid: expected a list of at least the baseline and one other arm"
    if not isinstance(block.get("arm_key"), str) or not block.get("arm_key"):
        return (f"comparison.arm_key={block.get('arm_key')!r} is invalid: expected the swept key naming the arms "
                f"(grpo_variant, dpo_variant, reference)")
    if block.get("baseline") not in arms:
        return (f"comparison.baseline={block.get('baseline')!r} is invalid: expected one of comparison.arms "
                f"({', '.join(map(str, arms))})")
    seeds = block.get("seeds")
    if not isinstance(seeds, list) or not seeds or not all(isinstance(x, int) for x in seeds):
        return f"comparison.seeds={seeds!r} is invalid: expected a non-empty list of seeds"
    others = [a for a in arms if a != block["baseline"]]
    primary = block.get("primary") or []
    if (not isinstance(primary, list) or len(primary) > MAX_PRIMARY or len(set(primary)) != len(primary)
            or any(a not in others for a in primary)):
        return (f"comparison.primary={primary!r} is invalid: expected one to {MAX_PRIMARY} distinct arms other than "
                f"the baseline ({', '.join(map(str, others))}), or empty")
    metric = block.get("metric") or DEFAULT_METRIC
    if metric not in PRIMARY_ENDPOINTS:
        return (f"comparison.metric={metric!r} is invalid: expected a held-out metric the report compares per prompt, "
                f"one of {', '.join(PRIMARY_ENDPOINTS)}")
    metrics = block.get("metrics") or []
    if not isinstance(metrics, list) or any(m not in PRIMARY_ENDPOINTS for m in metrics):
        return (f"comparison.metrics={metrics!r} is invalid: expected metrics among "
                f"{', '.join(PRIMARY_ENDPOINTS)}, or empty")
    matched = block.get("matched") or {}
    at, axis = matched.get("at") or [], matched.get("axis") or MATCHED_AXES[0]
    if at and (axis not in MATCHED_AXES or not isinstance(at, list) or not primary or not block.get("frontier_key")
               or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in at)
               or len(primary) * max(len(metrics), 1) * len(at) > MAX_PRIMARY):
        return (f"comparison.matched={matched!r} is invalid: expected an axis among {', '.join(MATCHED_AXES)} and "
                f"values > 0 to compare comparison.primary at along comparison.frontier_key, at most {MAX_PRIMARY} "
                f"contrasts in all, or no values")
    if (matched.get("along") or MATCHED_ALONG[0]) not in MATCHED_ALONG:
        return (f"comparison.matched.along={matched.get('along')!r} is invalid: expected "
                f"{' or '.join(MATCHED_ALONG)}")
    estimand = matched.get("estimand") or MATCHED_ESTIMANDS[0]
    if estimand not in MATCHED_ESTIMANDS:
        return (f"comparison.matched.estimand={matched.get('estimand')!r} is invalid: expected "
                f"{' or '.join(MATCHED_ESTIMANDS)}")
    if estimand == "crossing" and axis not in DRIFT_AXES:
        return (f"comparison.matched.estimand='crossing' is invalid: expected frontier on {axis} (crossing reads where "
                f"a run's drift, {' or '.join(DRIFT_AXES)}, first passes the value)")
    grids = matched.get("grids") or {}
    if not isinstance(grids, dict) or any(
            a not in arms or not isinstance(g, list) or len(g) < 2 or len(set(g)) != len(g)
            or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and b > 0 for b in g)
            for a, g in grids.items()):
        return (f"comparison.matched.grids={grids!r} is invalid: expected arms of comparison.arms, each with a list of "
                f"two or more distinct frontier-key values > 0")
    gap = matched.get("max_gap")
    least = 0.0 if axis == "eval/retention" else 1.0  # a difference on the linear axis, a ratio on a drift
    if gap is not None and not (valid_margin(gap) and gap > least):
        return (f"comparison.matched.max_gap={gap!r} is invalid: expected "
                + ("a difference > 0 on eval/retention" if least == 0 else f"a ratio > 1 on the drift axis {axis}")
                + ", or null")
    margin = block.get("equivalence_margin")
    if margin is not None and not valid_margin(margin):
        return f"comparison.equivalence_margin={margin!r} is invalid: expected a finite number > 0, or null"
    return None


def valid_margin(value: object) -> bool:
    """Whether ``value`` can be an equivalence margin: a finite number > 0 (an infinite one claims every difference
    equivalent, and summary.json holds no infinity)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def declared_margin(block: dict) -> Optional[float]:
    """The block's ``equivalence_margin`` (a positive number), read defensively: blocks written before the field
    existed have none, and then no equivalence claim is made."""
    value = block.get("equivalence_margin")
    if value is None:
        return None
    if not valid_margin(value):
        raise ValueError(f"comparison.equivalence_margin={value!r} is invalid: expected a finite number > 0 (the "
                         f"largest difference called equivalent), or null")
    return float(value)


def commits(run: Run) -> tuple[str, ...]:
    """The refexp commits that computed the run, in order (a run resumed across versions has several)."""
    return tuple(dict.fromkeys(str(p.get("commit")) for p in provenances(run.status or {})))


def threads(run: Run) -> Optional[int]:
    """``training.num_threads`` of the run's config (0: torch's default of its machine)."""
    v = _get(run.config, "training.num_threads")
    return int(v) if isinstance(v, int) else None


def _majority(values: list) -> object:
    return Counter(values).most_common(1)[0][0] if values else None


def make_plan(runs: list[Run], *, baseline: Optional[str] = None, block: Optional[dict] = None,
              alpha: float = 0.05, margin: Optional[float] = None, allow_mixed: bool = False) -> ComparisonPlan:
    """The plan of a report on ``runs``: ``block`` (the sweep callback's) else the runs' declared block; a
    ``baseline`` other than the block's makes the report exploratory."""
    notes: list[str] = []
    if block is None or not block.get("arms"):
        block, notes = declared_block(runs)
    if block is not None and baseline is not None and baseline != block.get("baseline"):
        notes.append(f"--baseline {baseline} is not the declared baseline {block.get('baseline')}: exploratory")
        block = None
    problem = block_problem(block) if block is not None else None
    if problem is not None:
        notes.append(f"the comparison block cannot be read ({problem}): the report is exploratory")
        block = None
    declared = declared_margin(block) if block is not None else None  # valid: block_problem checked it
    if margin is not None and declared is not None and margin != declared:
        notes.append(f"--equivalence-margin {margin:g} replaces the declared comparison.equivalence_margin "
                     f"{declared:g}: the equivalence claims are post hoc")
    margin = margin if margin is not None else declared
    why = "declared" if block is not None else "--baseline"
    if block is None and baseline is None:
        baseline, why = default_baseline(runs)
    plan = ComparisonPlan(block, baseline if block is None else str(block["baseline"]), alpha, margin, allow_mixed,
                          notes=notes, baseline_why=why, problem=problem or "")
    done = [r for r in runs if r.problem is None]
    common_commits, common_threads = _majority([commits(r) for r in done]), _majority([threads(r) for r in done])
    for r in done:
        why = []
        if block is not None:
            arm = plan.arm(r)
            if arm not in block["arms"]:
                why.append(f"{block['arm_key']}={arm} is outside the declared arms" if arm is not None
                           else f"no {block['arm_key']} override: outside the declared arms")
            if r.seed not in block.get("seeds", []):
                why.append(f"seed {r.seed} is outside the declared seeds {', '.join(map(str, block['seeds']))}")
        if commits(r) != common_commits:
            why.append(f"refexp commit {' then '.join(commits(r)) or 'not recorded'}, not the majority's "
                       f"{' then '.join(common_commits) or '(not recorded)'}")
        if threads(r) != common_threads:
            why.append(f"training.num_threads={threads(r)}, not the majority's {common_threads}")
        if why:
            plan.excluded[r.name] = "; ".join(why)
    return plan
