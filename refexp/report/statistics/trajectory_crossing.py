"""Each run read where its drift first passes a declared value: the reading behind the primary contrasts of
``comparison.matched.estimand: crossing`` (``crossing_contrasts.py`` assembles them).

A run's evaluations after step 0 at which it logged both the matched axis (a drift: ``kl/init``, ``kl/init_exact``)
and the metric give its trajectory. It is read where its drift first passes the value x between two of them
(``drift_crossing.first_crossing``, the rule the design step and ``scripts/analysis/trajectory_matched.py`` share):
its metric, and its per-prompt scores of those two evaluations (``eval_outcomes.jsonl``, ``Run.outcomes_of``), with
the same weight in log drift. Per replicate (SFT start, seed) an arm's value and per-prompt scores are the mean over
its runs (its frontier-key grid) that pass x, so a replicate's pair is what the shared-prompt paired bootstrap
(``metric_scores.paired_result``) takes for any other contrast. A replicate none of whose runs of an arm passes x
cannot be read, for one of ``drift_crossing.REASONS``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from refexp.report.reading.load import Run
from refexp.report.statistics.drift_crossing import between, crossing_weight, reached, replicate_reason
from refexp.report.statistics.metric_scores import aligned


@dataclass(frozen=True)
class RunCrossing:
    """One run read at its crossing of x: between its evaluations at ``steps`` (drift ``xs`` there)."""

    run: Run
    steps: tuple[int, int]
    xs: tuple[float, float]
    value: float
    """The metric at the crossing, the chord drawn in log drift."""
    linear: float
    """The same with the chord drawn in linear drift: the other chord a report prints beside it."""
    scores: Optional[dict[int, float]]
    """prompt id -> its score at the crossing (the two evaluations' per-prompt scores, weighted as ``value``); None
    where either evaluation logged none."""


def trajectory(run: Run, axis: str, metric: str) -> list[tuple[int, float, float]]:
    """(step, drift, metric) at each evaluation after step 0 where the run logged both, in step order."""
    xs, ys = (dict(zip(*run.series(k))) for k in (axis, metric))
    return [(int(s), float(xs[s]), float(ys[s])) for s in sorted(set(xs) & set(ys)) if s > 0]


def _scores(run: Run, metric: str, steps: tuple[int, int], f: float) -> Optional[dict[int, float]]:
    by_step = run.outcomes_of(metric)
    got = aligned([by_step.get(steps[0]), by_step.get(steps[1])])
    if got is None:
        return None
    ids, (lo, hi) = got
    return dict(zip(ids, between(lo, hi, f).tolist()))


def read_run(run: Run, axis: str, metric: str, x: float) -> tuple[Optional[RunCrossing], bool]:
    """(the run read where its ``axis`` first passes ``x``, or None where it does not; whether its drift reached ``x``
    at some evaluation after step 0)."""
    traj = trajectory(run, axis, metric)
    drift = [d for _, d, _ in traj]
    got = crossing_weight(drift, x)
    if got is None:
        return None, bool(reached(drift, x))
    j, f = got
    (s0, x0, y0), (s1, x1, y1) = traj[j], traj[j + 1]
    linear = between(y0, y1, (x - x0) / (x1 - x0))
    return RunCrossing(run, (s0, s1), (x0, x1), float(between(y0, y1, f)), float(linear),
                       _scores(run, metric, (s0, s1), f)), True


@dataclass(frozen=True)
class ReplicateReading:
    """One arm's runs of one replicate at x: those that pass it, or why none does."""

    crossings: list[RunCrossing]
    reason: Optional[str]
    """A ``drift_crossing.REASONS`` code where no run passes x; None where some do."""
    trajectories: list[list[tuple[int, float, float]]]
    """Every run's ``trajectory`` (those that pass x and those that do not): where a no claim's example comes from."""

    @property
    def value(self) -> float:
        return float(np.mean([c.value for c in self.crossings]))

    @property
    def linear(self) -> float:
        return float(np.mean([c.linear for c in self.crossings]))

    def scores(self) -> Optional[tuple[list[int], np.ndarray]]:
        """(prompt ids every crossing run scored, the runs' mean score on each [P]); None without them."""
        got = aligned([c.scores for c in self.crossings])
        return None if got is None else (got[0], np.mean(got[1], axis=0))


def read_replicate(runs: list[Run], axis: str, metric: str, x: float) -> ReplicateReading:
    """An arm's ``runs`` of one replicate read at ``x`` (``read_run`` each)."""
    read = [read_run(r, axis, metric, x) for r in runs]
    crossings = [c for c, _ in read if c is not None]
    return ReplicateReading(crossings, None if crossings else replicate_reason(any(hit for _, hit in read)),
                            [trajectory(r, axis, metric) for r in runs])


def unit_pair(arm: ReplicateReading, base: ReplicateReading):
    """(arm's scores [P], baseline's [P], arm - baseline, the prompt ids [P]) of one replicate, over the prompts both
    scored (``metric_scores.paired_result``'s entry); the scores None where a run logged none (the t alone)."""
    a, b = arm.scores(), base.scores()
    if a is None or b is None:
        return None, None, arm.value - base.value, []
    pos = {i: k for k, i in enumerate(b[0])}
    common = [(k, pos[i]) for k, i in enumerate(a[0]) if i in pos]
    if not common:
        return None, None, arm.value - base.value, []
    sa, sb = a[1][[k for k, _ in common]], b[1][[k for _, k in common]]
    return sa, sb, float(sa.mean() - sb.mean()), [a[0][k] for k, _ in common]
