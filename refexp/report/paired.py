"""Seed-paired differences against a baseline group, and the verdict sentences they support.

Every strategy of a sweep starts from the same SFT checkpoint, and a seed fixes the batch order and the
sampling noise, so run ``seed=k`` of a strategy and run ``seed=k`` of the baseline share most of their
randomness. The difference of their final accuracies, averaged over the seeds both completed, has a
much narrower interval than the difference of two unpaired means (the shared noise cancels). The
interval is the Student-t one of ``stats.mean_ci`` over the per-seed differences.

A verdict claims only what its interval supports: "higher"/"lower" when the 95% interval excludes 0,
"not separated" otherwise, and no claim at all from one paired seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from .group import Group
from .load import Run
from .stats import Estimate, mean_ci


@dataclass
class Paired:
    """A group's seed-paired difference (group - baseline) of one per-run number."""

    baseline: str
    """The baseline group's label."""
    estimate: Optional[Estimate]
    """Mean ± 95% CI over the seeds both groups completed (None: no common seed)."""
    seeds: list[int]


def find_baseline(groups: list[Group], baseline: str) -> Optional[Group]:
    """The group whose label is ``baseline``, else the only group of strategy ``baseline``, else the first
    of that strategy without swept settings of its own; None when the algorithm has none."""
    for g in groups:
        if g.label == baseline:
            return g
    of_strategy = [g for g in groups if g.strategy == baseline]
    if len(of_strategy) <= 1:
        return of_strategy[0] if of_strategy else None
    plain = [g for g in of_strategy if g.label == g.strategy]
    return plain[0] if plain else of_strategy[0]


def paired_difference(group: Group, baseline: Group, per_run: Callable[[Run], Optional[float]]) -> Paired:
    """``per_run(group's seed k) - per_run(baseline's seed k)`` over the seeds both completed."""
    base = {r.seed: per_run(r) for r in baseline.completed if r.seed is not None}
    diffs, seeds = [], []
    for r in group.completed:
        if r.seed in base and base[r.seed] is not None:
            v = per_run(r)
            if v is not None:
                diffs.append(v - base[r.seed])
                seeds.append(r.seed)
    return Paired(baseline.label, mean_ci(diffs), sorted(seeds))


def _signed(x: float, decimals: int = 3) -> str:
    return f"{x:+.{decimals}f}"


def verdict(algo: str, metric: str, paired: dict[str, Paired]) -> str:
    """One sentence per algorithm: what the seed-paired intervals against the baseline support.

    ``paired`` maps each non-baseline group's label to its ``Paired``; ``metric`` names the number
    (e.g. "final held-out accuracy")."""
    if not paired:
        return f"{algo.upper()}: no group to compare with a baseline."
    baseline = next(iter(paired.values())).baseline
    higher, lower, unseparated, unclaimed = [], [], [], []
    for label, p in paired.items():
        e = p.estimate
        if e is None or e.half_width is None:
            unclaimed.append(f"{label} ({'no common seed' if e is None else 'one paired seed'})")
            continue
        lo, hi = e.mean - e.half_width, e.mean + e.half_width
        text = f"{label} ({_signed(e.mean)}, 95% CI [{lo:+.3f}, {hi:+.3f}], {e.n} seeds)"
        (higher if lo > 0 else lower if hi < 0 else unseparated).append(text)
    parts = []
    if higher:
        parts.append(f"Higher than {baseline}: " + "; ".join(higher))
    if lower:
        parts.append(f"Lower than {baseline}: " + "; ".join(lower))
    if unseparated:
        parts.append(f"Not separated from {baseline} (the interval includes 0): " + "; ".join(unseparated))
    if unclaimed:
        parts.append("No claim: " + "; ".join(unclaimed))
    return f"{algo.upper()}, {metric}, seed-paired against {baseline}. " + ". ".join(parts) + "."
