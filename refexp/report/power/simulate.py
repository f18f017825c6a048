"""The declared analysis run on simulated sweeps of the whole design: each arm's runs drawn from its fitted curves
(``fit.py``) over the design's starts × seeds × β grid, each replicate read at the declared value by the report's
own rule (``statistics/reading_rules.replicate_problem``), each contrast's difference the mean over starts of the
mean over seeds (the Student t over the starts, else the seeds), Holm over the primary family.

Per primary contrast and declared value it counts P(no claim) (a simulated sweep in which any replicate of either arm
cannot be read) by reason, the spread of the estimate (its standard error, whence the detectable difference) and the
power at the margin: the share of simulated sweeps whose Holm-adjusted t rejects when the arm's curve is shifted so
that its true difference at the value is the margin.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
from scipy.stats import t as student_t

from refexp.report.power.fit import ArmFit, to_t
from refexp.report.statistics.frontier import weights
from refexp.report.statistics.frontier_points import Point
from refexp.report.statistics.reading_rules import read_between, replicate_problem


@dataclass(frozen=True)
class Rules:
    """How a replicate is read: the matched axis's scale, ``comparison.frontier_gap``,
    ``comparison.matched.max_gap`` and ``.along``."""

    log: bool
    key_gap: float
    max_gap: Optional[float]
    along: str = "axis"


@dataclass
class SimDesign:
    starts: int
    seeds: int
    grids: dict[str, list[float]]
    """arm -> its β grid."""
    baseline: str
    primary: list[str]
    at: list[float]
    rules: Rules
    alpha: float
    family: int
    margin: Optional[float]
    prompt_var: float = 0.0
    """The shared prompt × arm variance of one difference (components.prompt / prompts): one draw per contrast and
    simulated sweep, shared by its replicates."""

    @property
    def runs(self) -> int:
        return self.starts * self.seeds * sum(len(g) for g in self.grids.values())


@dataclass
class Draw:
    """One arm's simulated runs: [n, S, K, G] arrays of measured x, true t and y."""

    fit: ArmFit
    key: np.ndarray
    x: np.ndarray
    t_true: np.ndarray
    y: np.ndarray
    y_effect: np.ndarray
    """[n, S, K, G] the runs' start, seed and run effects on y (c + d + r): what a crossing reading keeps."""


def draw_arm(fit: ArmFit, grid: list[float], starts: int, seeds: int, n: int, rng: np.random.Generator) -> Draw:
    """``n`` simulated sweeps of one arm (``fit``'s model) at ``grid``."""
    lk = np.log(np.asarray(grid, dtype=float))
    run_var, meas_var = fit.spread(lk)
    shape = (n, starts, seeds, len(grid))
    t_true = (fit.drift(lk) + rng.normal(0, math.sqrt(fit.start_var), (n, starts, 1, 1))
              + rng.normal(0, math.sqrt(fit.seed_var), (n, starts, seeds, 1))
              + rng.normal(0, 1, shape) * np.sqrt(run_var - meas_var))
    t_meas = t_true + rng.normal(0, 1, shape) * np.sqrt(meas_var)
    effect = (rng.normal(0, math.sqrt(fit.y_start_var), (n, starts, 1, 1))
              + rng.normal(0, math.sqrt(fit.y_seed_var), (n, starts, seeds, 1))
              + rng.normal(0, math.sqrt(fit.y_run_var), shape))
    x = np.exp(t_meas) if fit.log else t_meas
    return Draw(fit, np.asarray(grid, dtype=float), x, t_true, fit.metric(t_true) + effect, effect)


def read_replicate(keys: np.ndarray, xs: np.ndarray, ys: np.ndarray, at: float,
                   rules: Rules) -> tuple[Optional[str], float]:
    """(the report's reason this replicate's curve cannot be read at ``at``, else None; its value there)."""
    pts = sorted((Point(None, float(k), float(x), float(y)) for k, x, y in zip(keys, xs, ys)),
                 key=lambda p: (p.x, p.value))
    why = replicate_problem(pts, at, rules.log, rules.key_gap, rules.max_gap, rules.along)
    if why is not None:
        return why, math.nan
    used = read_between(pts, at, rules.log, rules.along)
    if len(used) == 1:
        return None, used[0].y
    w = weights([p.x for p in used], at, rules.log)
    return None, float(w @ [p.y for p in used])


Reader = Callable[[Draw, int, float], tuple[list[Optional[str]], np.ndarray]]
"""(draw, sweep index, value) -> (each replicate's reason or None, [S, K] values)."""


def frontier_reader(rules: Rules) -> Reader:
    """The final-point frontier: each replicate's curve across the key read at the value (``read_replicate``)."""

    def read(d: Draw, i: int, at: float) -> tuple[list[Optional[str]], np.ndarray]:
        _, starts, seeds, _ = d.x.shape
        values, why = np.full((starts, seeds), math.nan), []
        for s in range(starts):
            for k in range(seeds):
                w, values[s, k] = read_replicate(d.key, d.x[i, s, k], d.y[i, s, k], at, rules)
                why.append(w)
        return why, values

    return read


@dataclass
class ContrastSim:
    """One primary contrast at one declared value, over the simulated sweeps."""

    arm: str
    at: float
    sweeps: int
    no_claim: int = 0
    reasons: Counter = field(default_factory=Counter)
    """reason -> in how many sweeps some replicate (of either arm) failed for it."""
    failing: Counter = field(default_factory=Counter)
    """reason -> how many replicates failed for it, over all sweeps."""
    estimates: list[float] = field(default_factory=list)
    truth: float = math.nan
    """The fitted curves' difference at the value (g_arm - g_baseline)."""
    rejected_at_margin: int = 0

    @property
    def p_no_claim(self) -> float:
        return self.no_claim / self.sweeps

    @property
    def se(self) -> float:
        return float(np.std(self.estimates, ddof=1)) if len(self.estimates) > 1 else math.nan

    @property
    def power(self) -> float:
        return self.rejected_at_margin / self.sweeps


def _p_value(diffs: np.ndarray) -> tuple[float, float]:
    """(estimate, two-sided p) of the Student t over the starts' mean differences (over the seeds with one start):
    ``diffs`` [S, K]."""
    units = diffs.mean(1) if diffs.shape[0] >= 2 else diffs[0]
    est = float(units.mean())
    sd = float(units.std(ddof=1)) if len(units) > 1 else math.nan
    if math.isnan(sd):
        return est, 1.0  # one unit: no test
    if sd == 0:
        return est, 0.0 if est != 0 else 1.0
    t = est / (sd / math.sqrt(len(units)))
    return est, float(2 * student_t.sf(abs(t), len(units) - 1))


def holm_rejects(p: list[float], alpha: float, family: int) -> list[bool]:
    """Holm's step-down over ``p`` as members of a family of ``family`` (the members not simulated never reject)."""
    order = np.argsort(p)
    out = [False] * len(p)
    for rank, j in enumerate(order):
        if p[j] > alpha / (family - rank):
            break
        out[j] = True
    return out


def simulate(fits: dict[str, ArmFit], d: SimDesign, n: int, seed: int = 0,
             reader: Optional[Reader] = None, truths: Optional[dict[tuple[str, float], float]] = None
             ) -> list[ContrastSim]:
    """``n`` simulated sweeps of design ``d``: one ``ContrastSim`` per primary arm × declared value. ``reader``: how
    a replicate is read (default ``frontier_reader``); ``truths``: (arm, value) -> the reading's true difference
    (default the fitted curves' at the value)."""
    rng = np.random.default_rng(seed)
    reader = reader or frontier_reader(d.rules)
    draws = {a: draw_arm(fits[a], d.grids[a], d.starts, d.seeds, n, rng) for a in [d.baseline, *d.primary]}
    out = []
    for arm in d.primary:
        for at in d.at:
            t_at = float(to_t(at, d.rules.log))
            truth = (truths or {}).get((arm, at), float(fits[arm].metric(t_at) - fits[d.baseline].metric(t_at)))
            out.append(ContrastSim(arm, at, n, truth=truth))
    shared = rng.normal(0, math.sqrt(d.prompt_var), (n, len(out)))
    for i in range(n):
        base = {at: reader(draws[d.baseline], i, at) for at in d.at}
        p_margin = []
        for j, c in enumerate(out):
            why_b, vb = base[c.at]
            why_a, va = reader(draws[c.arm], i, c.at)
            why = [w for w in why_b + why_a if w is not None]
            if why:
                c.no_claim += 1
                c.reasons.update(set(why))
                c.failing.update(why)
                p_margin.append(1.0)
                continue
            diffs = va - vb + shared[i, j]
            est, _ = _p_value(diffs)
            c.estimates.append(est)
            shift = (d.margin if d.margin is not None else 0.0) - c.truth
            p_margin.append(_p_value(diffs + shift)[1])
        for c, r in zip(out, holm_rejects(p_margin, d.alpha, d.family)):
            c.rejected_at_margin += r
    return out
