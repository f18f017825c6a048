"""The trajectory-crossing estimand (``comparison.matched.estimand: crossing``) as the design step simulates it: each
run read at the step its drift first passes the declared value, interpolated in log drift between two evaluations
after step 0 (``scripts/analysis/trajectory_matched.py``'s ``crossing``); per replicate an arm's value is the mean
over its runs that pass it, and a replicate none of whose runs of an arm passes it cannot be read.

A simulated run's drift grows along its run as x(step) = x_final (step / steps)^s: it passes the value between two
evaluations after step 0 where x(first evaluation) <= value <= x_final. The exponent s is the pilot's (the mean
slope of log(x(step) / x_final) on log(step / steps) over its runs' evaluations), or 1 (drift growing in proportion
to the steps) where the pilot evaluated at its end only; the metric at the crossing is the arm's fitted curve there
(``fit.py``'s g, from the final points: an assumption where the pilot has no evaluation in between) plus the run's
own start, seed and run effects. A design evaluated only at step 0 and at its end never sees a run pass the value.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from refexp.report.power.fit import ArmFit, to_t
from refexp.report.power.pilot_runs import PilotRuns
from refexp.report.power.simulate import Draw, Reader

REASONS = {"never_reached": "no run's drift reached it", "passed_before_first_eval": "every run that reached it had "
           "passed it by its first evaluation after step 0"}


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


def crossing_reader(fits: dict[str, ArmFit], steps: int, every: int, exponent: float, log: bool) -> Reader:
    """The crossing reading of a simulated sweep (``simulate.Reader``)."""
    first = eval_steps(steps, every)[0]
    back = exponent * math.log(first / steps) if log else 0.0

    def read(d: Draw, i: int, at: float) -> tuple[list[Optional[str]], np.ndarray]:
        t_at = float(to_t(at, log))
        t_final = to_t(d.x[i], log)  # [S, K, G]
        passes = (t_final >= t_at) & (t_final + back <= t_at) & (first < steps)
        arm = next(a for a, f in fits.items() if f is d.fit)
        value = fits[arm].metric(np.full(t_final.shape, t_at)) + d.y_effect[i]
        n = passes.sum(-1)
        values = np.where(n > 0, (value * passes).sum(-1) / np.maximum(n, 1), math.nan)
        reached = (t_final >= t_at).any(-1)
        why = [None if n[s, k] else "never_reached" if not reached[s, k] else "passed_before_first_eval"
               for s in range(n.shape[0]) for k in range(n.shape[1])]
        return why, values

    return read
