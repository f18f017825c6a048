"""Whether one replicate's curve can be read at a matched value: the rule the report's matched contrasts
(``declared_matched.py``, ``frontier.matched``) and the design step that predicts "no claim" share.

A replicate's curve is an arm's runs across the frontier key (β) in one (SFT start, seed), each a ``Point`` (its key
value, final matched-axis x, final metric y). At x it is read between two runs: the two nearest x on either side
(``along="axis"``) or the neighbours on the key's grid whose x straddle it (``along="key"``, ``key_crossing``). It
cannot be read, and the contrast makes no claim, where
- x lies outside the x its runs reached (a matched value is never extrapolated): ``outside``;
- walked along the key, its runs never cross x although x lies inside their range: ``order`` (a guard: a path
  through every run spans their whole range, so ``key_crossing`` finds a pair wherever x is inside it);
- the two runs are farther apart on the matched axis than ``comparison.matched.max_gap`` (a ratio on a log axis,
  a difference on a linear one): ``axis_gap`` -- a chord across a wide step misplaces a curve that bends;
- the two runs' key values are farther apart than a factor ``comparison.frontier_gap``: ``key_gap``, the older
  rule, kept as a second guard.
x exactly on a run is read there (no chord, no gap).
"""

from __future__ import annotations

from collections import Counter
from typing import Optional

import numpy as np

from refexp.report.statistics.frontier_key import key_crossing
from refexp.report.statistics.frontier_points import Point
from refexp.report.statistics.paired import Unit

REASONS = {"outside": "outside the runs' range", "axis_gap": "gap too wide on the matched axis",
           "key_gap": "gap too wide in the frontier key", "order": "order reversed"}
"""Reason code -> what it means, in the order a report lists them."""

TOL = 1e-9
"""Relative slack on every comparison of x or of a ratio: a value equal to a run's x up to rounding is on it."""


def covers(pts: list[Point], x: float) -> bool:
    """Whether ``x`` lies in [min x, max x] of ``pts`` (up to ``TOL``)."""
    xs = [p.x for p in pts]
    return bool(xs) and min(xs) - TOL * abs(min(xs)) <= x <= max(xs) + TOL * abs(max(xs))


def read_between(pts: list[Point], x: float, log: bool, along: str = "axis") -> Optional[list[Point]]:
    """The runs of ``pts`` the curve at ``x`` is read from, sorted by x: one where x lies on a run, else two
    (``along="axis"``: the nearest below and above x; ``"key"``: ``key_crossing``'s pair); None where x lies outside
    the runs' range or, along the key, they never cross it. ``log``: the chord is drawn in log x (no effect on which
    runs, only kept for one signature with the weights it feeds)."""
    del log  # which two runs does not depend on the chord's scale
    if not covers(pts, x):
        return None
    if along == "key":
        pair = key_crossing(pts, x)
        if pair is None:
            return None
    else:
        pair = sorted(pts, key=lambda p: (p.x, p.value))
    on = [p for p in pair if abs(p.x - x) <= TOL * max(abs(x), 1e-300)]
    if on:
        return [on[0]]
    below = max((p for p in pair if p.x < x), key=lambda p: (p.x, p.value))
    above = min((p for p in pair if p.x > x), key=lambda p: (p.x, p.value))
    return [below, above]


def axis_step_too_wide(lo: float, hi: float, log: bool, max_gap: Optional[float]) -> bool:
    """Whether two runs at x ``lo`` <= ``hi`` are farther apart than ``max_gap`` on the matched axis (ratio hi/lo
    on a log axis, difference on a linear one); never with ``max_gap`` None."""
    if max_gap is None:
        return False
    if log:
        return not (lo > 0 and hi / lo <= max_gap * (1 + TOL))
    return hi - lo > max_gap * (1 + TOL)


def key_step_too_wide(a: float, b: float, key_gap: float) -> bool:
    """Whether two runs' frontier-key values are farther apart than a factor ``key_gap`` (or not both positive, so
    no ratio)."""
    return not (a > 0 and b > 0 and max(a, b) / min(a, b) <= key_gap * (1 + TOL))


def replicate_problem(pts: list[Point], x: float, log: bool, key_gap: float, max_gap: Optional[float],
                      along: str = "axis") -> Optional[str]:
    """Why one replicate's curve (``pts``) cannot be read at ``x``: a key of ``REASONS``; None when it can.
    ``log``: the matched axis is read in log (``max_gap`` a ratio) else linearly (a difference); ``key_gap``:
    ``comparison.frontier_gap``; ``max_gap``: ``comparison.matched.max_gap`` (None: no axis rule); ``along``:
    ``comparison.matched.along``."""
    if not covers(pts, x):
        return "outside"
    used = read_between(pts, x, log, along)
    if used is None:
        return "order"
    if len(used) < 2:
        return None
    a, b = used
    if axis_step_too_wide(a.x, b.x, log, max_gap):
        return "axis_gap"
    if key_step_too_wide(a.value, b.value, key_gap):
        return "key_gap"
    return None


def replicate_problems(curve: dict[Unit, list[Point]], seeds: list[Unit], x: float, log: bool, key_gap: float,
                       max_gap: Optional[float], along: str = "axis") -> dict[Unit, str]:
    """Replicate -> its ``replicate_problem`` at ``x``, for each of ``seeds`` whose curve cannot be read there
    (in the order of ``seeds``); empty when every one can."""
    out = {}
    for s in seeds:
        why = replicate_problem(curve.get(s, []), x, log, key_gap, max_gap, along)
        if why is not None:
            out[s] = why
    return out


def failure_counts(arms: dict[str, dict[Unit, list[Point]]], seeds: list[Unit], x: float, log: bool,
                   key_gap: float, max_gap: Optional[float], along: str = "axis") -> dict[str, dict[str, int]]:
    """Arm (each key of ``arms``: its curve by replicate) -> reason code -> how many of ``seeds`` fail for it at
    ``x``; an arm none of whose replicates fails maps to {}. A contrast is readable only where every count is 0."""
    return {arm: dict(Counter(replicate_problems(curve, seeds, x, log, key_gap, max_gap, along).values()))
            for arm, curve in arms.items()}


def bracket(curve: dict[Unit, list[Point]], seeds: list[Unit], x: float, along: str = "axis") -> tuple[float, float]:
    """(lower, upper): over ``seeds``, the medians of the final x of the two runs each replicate's curve is read
    between at ``x`` (``read_between``; both the run's x where x lies on one). Every replicate must be readable
    (``replicate_problem`` None or an axis/key gap): a chord across that step misplaces a curve that bends between
    the two runs, the more the wider the step."""
    used = [read_between(curve[s], x, True, along) for s in seeds]
    if any(u is None for u in used):
        raise ValueError(f"{x} lies outside a replicate's runs, or they never cross it along the key")
    return float(np.median([u[0].x for u in used])), float(np.median([u[-1].x for u in used]))
