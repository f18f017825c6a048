"""The trajectory-crossing estimand (``comparison.matched.estimand: crossing``) as the design step simulates it: each
run read at the step its drift first passes the declared value, interpolated in log drift between two evaluations
after step 0 (``statistics/drift_crossing.py``: the rule the report's ``trajectory_crossing.py`` and
``scripts/analysis/trajectory_matched.py`` read runs by); per replicate an arm's value is the mean over its runs that
pass it, and a replicate none of whose runs of an arm passes it cannot be read.

A simulated run's drift grows along its run as x(step) = x_final (step / steps)^s, evaluated at the design's steps;
the exponent s is the pilot's (the mean slope of log(x(step) / x_final) on log(step / steps) over its runs'
evaluations), or 1 (drift growing in proportion to the steps) where the pilot evaluated at its end only. Its metric at
each evaluation is the arm's fitted curve there (``fit.py``'s g, from the final points: an assumption where the pilot
has no evaluation in between) plus the run's own start, seed and run effects, and the crossing reads it between the
two evaluations exactly as the report reads a run's logged values. A design evaluated only at step 0 and at its end
never sees a run pass the value. Drift axes only (read in log): the crossing of a linear axis is not an estimand.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from refexp.report.power.fit import ArmFit, to_t
from refexp.report.power.pilot_runs import PilotRuns
from refexp.report.power.simulate import Draw, Reader
from refexp.report.statistics.drift_crossing import REASONS, between, first_crossing, reached, replicate_reason

__all__ = ["REASONS", "crossing_reader", "eval_steps", "growth_exponent"]


def eval_steps(steps: int, every: int) -> list[int]:
    """The steps a run evaluates at after step 0: every ``every``, and the last."""
    got = list(range(every, steps, every)) if every > 0 else []
    return sorted(set(got + [steps]))


def growth_exponent(pilot: PilotRuns, log: bool) -> Optional[float]:
    """s (module doc) from the pilot's runs with two or more evaluations after step 0 with drift > 0; None when none
    has them."""
    num = den = 0.0
    for r in pilot.runs:
        pts = [(s, x) for s, x, _ in r.trajectory if x > 0]
        if len(pts) < 2 or not log:
            continue
        last_step, last_x = pts[-1]
        for s, x in pts[:-1]:
            u = math.log(s / last_step)
            num += u * math.log(x / last_x)
            den += u * u
    return num / den if den > 0 else None


def trajectories(t_final: np.ndarray, steps: int, every: int, exponent: float) -> np.ndarray:
    """[..., E] log drift at each evaluation after step 0 (``eval_steps``) of runs ending at log drift ``t_final``
    [...]: t_final + s log(step / steps) (module doc)."""
    u = exponent * np.log(np.asarray(eval_steps(steps, every), dtype=float) / steps)
    return np.asarray(t_final, dtype=float)[..., None] + u


def crossing_reader(fits: dict[str, ArmFit], steps: int, every: int, exponent: float, log: bool) -> Reader:
    """The crossing reading of a simulated sweep (``simulate.Reader``); ``log`` must be True (a drift axis)."""
    if not log:
        raise ValueError("the crossing estimand reads a drift, in log: a linear matched axis has none")
    del fits  # each draw carries its arm's fit

    def read(d: Draw, i: int, at: float) -> tuple[list[Optional[str]], np.ndarray]:
        t = trajectories(to_t(d.x[i], log), steps, every, exponent)  # [S, K, G, E]
        xs = np.exp(t)
        j, f = first_crossing(xs, at)  # [S, K, G]
        lower = np.maximum(j, 0)[..., None]  # the crossing's lower evaluation (0 where none: masked below)
        upper = np.minimum(lower + 1, t.shape[-1] - 1)
        effect = d.y_effect[i]
        y0 = d.fit.metric(np.take_along_axis(t, lower, -1)[..., 0]) + effect
        y1 = d.fit.metric(np.take_along_axis(t, upper, -1)[..., 0]) + effect
        passes = j >= 0
        n = passes.sum(-1)
        value = np.where(passes, between(y0, y1, f), 0.0)
        values = np.where(n > 0, value.sum(-1) / np.maximum(n, 1), math.nan)
        hit = reached(xs, at).any(-1)
        why = [None if n[s, k] else replicate_reason(bool(hit[s, k]))
               for s in range(n.shape[0]) for k in range(n.shape[1])]
        return why, values

    return read
