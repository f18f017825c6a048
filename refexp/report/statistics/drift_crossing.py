"""Where a run's drift first passes a value: the one rule of the trajectory-crossing estimand, shared by the report
(``trajectory_crossing.py``), the design step's simulation (``refexp/report/power/crossing.py``) and the exploratory
script (``scripts/analysis/trajectory_matched.py``).

A run's evaluations after step 0, in step order, give its drift x_0, x_1, ... (``kl/init`` or ``kl/init_exact``).
It passes the value a between evaluations j and j + 1 where 0 < x_j <= a <= x_(j+1) and x_(j+1) > x_j, the first such
j; it is read there with the weight f = log(a / x_j) / log(x_(j+1) / x_j) (in log drift; ``log=False``: linearly, the
other chord a report prints beside it), a metric y as y_j + f (y_(j+1) - y_j) (``between``). Step 0 is never one end:
every run starts at drift 0, which no log scale reaches. A run that does not pass it either never reached it at any
evaluation (``never_reached``) or was at or past it by its first evaluation after step 0 (with drift > 0; a drift that
only falls through a later does not pass it upward either): ``passed_before_first_eval``.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

REASONS = {"never_reached": "no run's drift reached it", "passed_before_first_eval": "every run that reached it had "
           "passed it by its first evaluation after step 0"}
"""Why a replicate's runs of an arm give no reading at the value (none of them passes it): reason code -> what it
means, said of the replicate's runs."""


def first_crossing(xs: np.ndarray | Sequence[float], at: float, log: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(j [...], f [...]) of runs whose drift at their evaluations after step 0 is ``xs`` [..., E] (module doc):
    the first segment (j, j + 1) that passes ``at`` and the weight of its upper end; j -1 and f nan where a run does
    not pass it (fewer than 2 evaluations, or never between two)."""
    xs = np.asarray(xs, dtype=float)
    j, f = np.full(xs.shape[:-1], -1), np.full(xs.shape[:-1], math.nan)
    if xs.shape[-1] < 2:
        return j, f
    lo, hi = xs[..., :-1], xs[..., 1:]
    ok = (lo <= at) & (at <= hi) & (hi > lo) & ((lo > 0) if log else True)
    hit, first = ok.any(-1), np.argmax(ok, -1)
    a = np.take_along_axis(lo, first[..., None], -1)[..., 0]
    b = np.take_along_axis(hi, first[..., None], -1)[..., 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.log(at / a) / np.log(b / a) if log else (at - a) / (b - a)
    return np.where(hit, first, j), np.where(hit, share, f)


def between(y0, y1, f):
    """The reading at weight ``f`` between two evaluations' values ``y0`` and ``y1`` (numbers or arrays)."""
    return y0 + f * (y1 - y0)


def crossing_weight(xs: Sequence[float], at: float, log: bool = True) -> Optional[tuple[int, float]]:
    """``first_crossing`` of one run: (j, f), or None where it does not pass ``at``."""
    j, f = first_crossing(list(xs), at, log)
    return None if int(j) < 0 else (int(j), float(f))


def crossing_value(points: Sequence[tuple[float, float]], at: float) -> Optional[float]:
    """The metric where a run's drift first passes ``at`` (``points``: (drift, metric) at its evaluations after step 0
    in step order), interpolated in log drift; None where it does not pass it."""
    got = crossing_weight([x for x, _ in points], at)
    if got is None:
        return None
    j, f = got
    return float(between(points[j][1], points[j + 1][1], f))


def reached(xs: np.ndarray | Sequence[float], at: float) -> np.ndarray:
    """Whether each run's drift (``xs`` [..., E] as ``first_crossing``'s) reached ``at`` at some evaluation after step
    0 [...]: a run that does not pass it but reached it had passed it before its first evaluation."""
    xs = np.asarray(xs, dtype=float)
    return (xs >= at).any(-1) if xs.shape[-1] else np.zeros(xs.shape[:-1], dtype=bool)


def replicate_reason(any_reached: bool) -> str:
    """The ``REASONS`` code of a replicate none of whose runs passes the value, from whether one of them reached it
    (``reached``)."""
    return "passed_before_first_eval" if any_reached else "never_reached"
