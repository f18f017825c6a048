"""Which runs a verdict is about: the comparison the experiment declared (its ``comparison`` block, read from the
runs' ``resolved_config.yaml``), or an exploratory one against ``--baseline`` or ``default_baseline``'s.

Runs outside the declared seeds or arms, and runs from another refexp commit or thread count than the majority
of the sweep's completed runs, are listed (``ComparisonPlan.excluded``) and left out of the verdict unless
``--allow-mixed``. The baseline is the declared block's, else ``--baseline``; an ad-hoc sweep that names neither
(``refexp -m reference=fixed,none ...``) is compared against ``fixed`` where a group is that, else its first
group (``default_baseline``), and the report says which and why: every such report is exploratory.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from refexp.record.status import provenances

from refexp.report.reading.group import group_runs
from refexp.report.reading.load import Run, _get

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
        baseline (``--baseline`` or ``default_baseline``'s) naming its label or its swept variant value (``match_baseline`` makes sure only one group matches)."""
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


def declared_margin(block: dict) -> Optional[float]:
    """The block's ``equivalence_margin`` (a positive number), read defensively: blocks written before the field
    existed have none, and then no equivalence claim is made."""
    value = block.get("equivalence_margin")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"comparison.equivalence_margin={value!r} is invalid: expected a number > 0 (the largest "
                         f"difference called equivalent), or null")
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
    why = "declared" if block is not None else "--baseline"
    if margin is None and block is not None:
        margin = declared_margin(block)
    if block is None and baseline is None:
        baseline, why = default_baseline(runs)
    plan = ComparisonPlan(block, baseline if block is None else str(block["baseline"]), alpha, margin, allow_mixed,
                          notes=notes, baseline_why=why)
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
