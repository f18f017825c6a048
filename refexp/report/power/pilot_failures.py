"""What the pilot's own replicates say about "no claim", by the report's rule alone (no model): how many of its
replicates (SFT start, seed) could not be read at the declared value, and the Clopper-Pearson bound on that rate
carried to the design's replicate count. A pilot of few replicates bounds the rate loosely: 0 failures in 4 is
consistent with a per-replicate rate of 0.60 (95%), and a design of 24 replicates then fails almost surely.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from scipy.stats import beta

from refexp.report.power.pilot_runs import PilotRuns
from refexp.report.power.simulate import Rules
from refexp.report.statistics.frontier_points import Point
from refexp.report.statistics.reading_rules import replicate_problem

LEVEL = 0.95


@dataclass
class PilotFailures:
    """The replicates of one contrast (baseline and arm, both run) and those that could not be read."""

    replicates: int
    failed: int
    reasons: Counter

    def upper(self) -> float:
        """The two-sided 95% Clopper-Pearson upper bound of the per-replicate failure rate."""
        if self.replicates == 0:
            return 1.0
        if self.failed >= self.replicates:
            return 1.0
        return float(beta.ppf(1 - (1 - LEVEL) / 2, self.failed + 1, self.replicates - self.failed))

    def rate(self) -> float:
        return self.failed / self.replicates if self.replicates else float("nan")


def carried(rate: float, replicates: int) -> float:
    """P(some replicate of ``replicates`` fails) at a per-replicate ``rate``, replicates independent."""
    return 1.0 - (1.0 - rate) ** replicates


def pilot_failures(pilot: PilotRuns, baseline: str, arm: str, at: float, rules: Rules) -> PilotFailures:
    """The pilot's replicates holding runs of both ``baseline`` and ``arm``, and those either curve of which
    ``replicate_problem`` refuses at ``at`` (the report's rule, on the pilot's own grids)."""
    curves: dict[str, dict[tuple, list[Point]]] = {}
    for r in pilot.runs:
        if r.arm in (baseline, arm):
            curves.setdefault(r.arm, {}).setdefault((r.start, r.seed), []).append(Point(None, r.key, r.x, r.y))
    reps = sorted(set(curves.get(baseline, {})) & set(curves.get(arm, {})))
    reasons: Counter = Counter()
    failed = 0
    for rep in reps:
        why = [w for w in (replicate_problem(sorted(curves[a][rep], key=lambda p: (p.x, p.value)), at, rules.log,
                                             rules.key_gap, rules.max_gap, rules.along) for a in (baseline, arm))
               if w is not None]
        failed += bool(why)
        reasons.update(set(why))
    return PilotFailures(len(reps), failed, reasons)
