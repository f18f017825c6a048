"""Each arm's two curves fitted from a pilot's runs, with their start, seed and run variance: what the design step
simulates a sweep from (``simulate.py``).

Drift against the frontier key (β). On t = log x (x the matched axis, e.g. kl/init; t = x on a linear axis such as
eval/retention) and log β, per run

    t[s, k, β] = f_arm(log β) + a[s] + b[s, k] + e[s, k, β],   e = e_true + m   (m: the x measurement's own noise)

f_arm is the piecewise-linear curve through the pilot's per-β means of t, made monotone by pooling adjacent
violators (drift falls as β grows; the direction is the data's), extended past the pilot's grid along its end
segments. Why not a smooth parametric curve: a moving reference's drift is flat at small β (a policy that answers
every prompt alike stops adding drift) and falls steeply past a knee (EMA: β 5 -> 10 halves it), which neither a line
nor a quadratic in log β follows; the per-β means are what the pilot measured, and the table is inspectable.
a (between SFT starts) and b (between seeds of a start) are the method of moments on the residuals t - f_arm nested
as runs in replicates in starts (as ``pilot.py``'s); e's variance is each β's own (the residual spread differs along
the grid: fixed's β 5 runs scatter four times wider than its β 1 runs), and m's is the mean over that β's runs of
var(per-prompt contribution) / (n x²), the token-and-prompt sampling noise of x where the runs logged it.

Metric against drift. Per run y = g_arm(t_true) + c[s] + d[s, k] + r, g_arm a cubic in t fitted by least squares
to the runs (held flat past the pilot's range of t: an accuracy saturates, and no run says what lies beyond), c, d,
r by the same nested moments on its residuals. A cubic is the smallest polynomial that follows both an accuracy's
S-shape over the drifts the runs reached and a gold reward that peaks and falls (4 numbers an arm, printed). The fit
is on the measured x, so r holds the measurement's share too (the plan errs toward noise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import harmonic_mean

import numpy as np

from refexp.report.power.pilot_runs import PilotRun


def to_t(x: np.ndarray | float, log: bool) -> np.ndarray:
    """The axis's scale: log x on a log axis (x <= 0 read at 1e-12), else x."""
    return np.log(np.maximum(x, 1e-12)) if log else np.asarray(x, dtype=float)


def nested_components(values: np.ndarray, starts: list[str], reps: list[tuple]) -> tuple[float, float, float]:
    """(start, seed, within) variances of ``values`` [n], runs nested in replicates (``reps``) nested in starts, by
    the method of moments (negative estimates 0; a level with one member per parent gives 0)."""
    by_rep: dict[tuple, list[float]] = {}
    for v, r in zip(values, reps):
        by_rep.setdefault(r, []).append(float(v))
    dof_w = sum(len(v) - 1 for v in by_rep.values())
    within = sum(((np.array(v) - np.mean(v)) ** 2).sum() for v in by_rep.values()) / dof_w if dof_w else 0.0
    n_per_rep = harmonic_mean([len(v) for v in by_rep.values()])
    by_start: dict[str, list[float]] = {}
    for r, v in by_rep.items():
        by_start.setdefault(starts[reps.index(r)], []).append(float(np.mean(v)))
    dof_b = sum(len(m) - 1 for m in by_start.values())
    between = (sum(((np.array(m) - np.mean(m)) ** 2).sum() for m in by_start.values()) / dof_b) if dof_b else None
    seed = max(0.0, between - within / n_per_rep) if between is not None else 0.0
    start = 0.0
    if len(by_start) >= 2:
        k = harmonic_mean([len(m) for m in by_start.values()])
        spread = between if between is not None else within / n_per_rep
        start = max(0.0, float(np.var([np.mean(m) for m in by_start.values()], ddof=1)) - spread / k)
    return start, seed, float(within)


def pooled_monotone(means: np.ndarray, weights: np.ndarray, increasing: bool) -> np.ndarray:
    """The weighted least-squares monotone (non-decreasing if ``increasing``) fit to ``means``: pool adjacent
    violators."""
    sign = 1.0 if increasing else -1.0
    blocks = [[sign * m, w, 1] for m, w in zip(means, weights)]
    out: list[list[float]] = []
    for b in blocks:
        out.append(b)
        while len(out) > 1 and out[-2][0] > out[-1][0]:
            (m1, w1, n1), (m2, w2, n2) = out[-2], out[-1]
            out[-2:] = [[(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2]]
    return np.array([sign * m for m, _, n in out for _ in range(int(n))])


@dataclass
class ArmFit:
    """One arm's fitted curves and variances (module doc); all on the axis's scale t."""

    arm: str
    log: bool
    log_keys: np.ndarray
    """[G] log β of the pilot's grid, ascending."""
    raw_t: np.ndarray
    """[G] the pilot's mean t at each β."""
    mean_t: np.ndarray
    """[G] f_arm at the grid: ``raw_t`` made monotone."""
    run_var: np.ndarray
    """[G] e's variance at each β (the measurement's share included)."""
    meas_var: np.ndarray
    """[G] m's variance at each β (0 where not logged)."""
    start_var: float
    seed_var: float
    coef: np.ndarray
    """g_arm's cubic in t, highest power first (``np.polyval``)."""
    t_range: tuple[float, float]
    y_start_var: float
    y_seed_var: float
    y_run_var: float
    runs: int

    def drift(self, log_key: np.ndarray) -> np.ndarray:
        """f_arm at ``log_key`` (any shape): piecewise-linear through the grid, extended along the end segments."""
        k, m = self.log_keys, self.mean_t
        if len(k) == 1:
            return np.full(np.shape(log_key), m[0])
        lk = np.asarray(log_key, dtype=float)
        out = np.interp(lk, k, m)
        lo_slope, hi_slope = (m[1] - m[0]) / (k[1] - k[0]), (m[-1] - m[-2]) / (k[-1] - k[-2])
        out = np.where(lk < k[0], m[0] + lo_slope * (lk - k[0]), out)
        return np.where(lk > k[-1], m[-1] + hi_slope * (lk - k[-1]), out)

    def spread(self, log_key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(e's variance, m's variance) at ``log_key``: the nearest pilot β's."""
        j = np.abs(np.asarray(log_key, dtype=float)[..., None] - self.log_keys).argmin(-1)
        return self.run_var[j], self.meas_var[j]

    def metric(self, t: np.ndarray) -> np.ndarray:
        """g_arm at ``t``, flat past the pilot's range."""
        return np.polyval(self.coef, np.clip(t, *self.t_range))

    def key_at(self, t: float) -> float | None:
        """The β where f_arm reaches ``t`` (the largest, where it is flat there), searched two decades past the grid;
        None where it never does."""
        lk = np.linspace(self.log_keys[0] - math.log(100), self.log_keys[-1] + math.log(100), 4001)
        d = self.drift(lk) - t
        cross = np.nonzero(np.sign(d[:-1]) != np.sign(d[1:]))[0]
        if not len(cross):
            return None
        j = cross[-1]
        share = d[j] / (d[j] - d[j + 1]) if d[j] != d[j + 1] else 0.0
        return float(math.exp(lk[j] + share * (lk[j + 1] - lk[j])))


def fit_arm(arm: str, runs: list[PilotRun], log: bool) -> ArmFit:
    """``ArmFit`` of one arm's pilot runs (two or more distinct β, four or more runs)."""
    t = to_t(np.array([r.x for r in runs]), log)
    lk = np.log(np.array([r.key for r in runs]))
    keys = np.unique(lk)
    cell = np.searchsorted(keys, lk)
    raw = np.array([t[cell == j].mean() for j in range(len(keys))])
    counts = np.array([(cell == j).sum() for j in range(len(keys))], dtype=float)
    increasing = bool(np.polyfit(lk, t, 1)[0] >= 0) if len(keys) > 1 else False
    mean = pooled_monotone(raw, counts, increasing)
    starts, reps = [r.start for r in runs], [(r.start, r.seed) for r in runs]
    resid = t - mean[cell]
    start_var, seed_var, _ = nested_components(resid, starts, reps)
    run_var = np.array([max(0.0, float(resid[cell == j].var(ddof=1)) - start_var - seed_var)
                        if counts[j] > 1 else 0.0 for j in range(len(keys))])
    meas_var = np.zeros(len(keys))
    for j in range(len(keys)):
        got = [r.x_var / max(r.x, 1e-12) ** 2 if log else r.x_var for r, c in zip(runs, cell)
               if c == j and r.x_var is not None]
        meas_var[j] = float(np.mean(got)) if got else 0.0
    run_var = np.maximum(run_var, meas_var)
    y = np.array([r.y for r in runs])
    degree = min(3, len(np.unique(np.round(t, 9))) - 1)
    coef = np.polyfit(t, y, degree) if degree >= 1 else np.array([y.mean()])
    y_start, y_seed, y_run = nested_components(y - np.polyval(coef, t), starts, reps)
    return ArmFit(arm, log, keys, raw, mean, run_var, meas_var, start_var, seed_var, coef,
                  (float(t.min()), float(t.max())), y_start, y_seed, y_run, len(runs))
