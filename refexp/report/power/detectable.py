"""Power of a planned comparison: the standard error of an arm - baseline difference under the design's variance
components, and the smallest difference its test detects with a given power.

The model of one paired difference (arm - baseline) on prompt p of seed k of SFT start s:

    d[s, k, p] = Δ + a[s] + b[s, k] + c[p] + e[s, k, p]

a ~ (0, start) the arm effect's spread between SFT starts, b ~ (0, seed) between seeds of a start, c ~ (0, prompt)
the prompt × arm effect every unit shares (every run is scored on the same prompts), e ~ (0, residual). The
difference is the mean over S starts × K seeds × P prompts, so

    Var = start / S + seed / (S K) + prompt / P + residual / (S K P).

The test that must reject is a Student t over the top-level units (the starts with two or more, else the seeds:
``refexp/report/statistics/paired.py``), so its degrees of freedom are S - 1, else K - 1; its power at a true
difference δ is that of a two-sided t test at level alpha with noncentrality δ / se (Cohen 1988, ch. 2; R's
``power.t.test``), with the prompts' shared variance in se as the shared-prompt bootstrap carries it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from scipy.integrate import quad
from scipy.optimize import brentq
from scipy.special import gammaincinv, ndtr
from scipy.stats import t as student_t


@dataclass(frozen=True)
class Components:
    """Variance components of a paired difference (module doc), in the metric's units squared."""

    start: float
    seed: float
    """Between seeds of a start; where ``residual`` is None, measured at the pilot's prompts (it then holds the
    residual's share residual / P_pilot too)."""
    prompt: float
    residual: Optional[float]
    """None: not separable from ``seed`` (a pilot without per-prompt outcomes)."""


@dataclass(frozen=True)
class Design:
    """What a sweep will run: SFT starts, seeds per start, prompts per evaluation, and its family."""

    starts: int
    seeds: int
    prompts: int
    alpha: float
    family: int
    """How many primary contrasts × primary metrics share Holm's family (its first step tests at alpha / family)."""


def standard_error(c: Components, d: Design) -> float:
    """sqrt(start / S + seed / (S K) + prompt / P + residual / (S K P))."""
    var = c.start / d.starts + c.seed / (d.starts * d.seeds) + c.prompt / d.prompts
    if c.residual is not None:
        var += c.residual / (d.starts * d.seeds * d.prompts)
    return math.sqrt(var)


def degrees_of_freedom(d: Design) -> int:
    """The t's degrees of freedom: starts - 1 with two or more starts, else seeds - 1."""
    return d.starts - 1 if d.starts >= 2 else d.seeds - 1


def power_at(delta: float, se: float, df: float, alpha: float) -> float:
    """P(|T| > t_{1 - alpha/2, df}) for T = (Z + delta/se) / sqrt(V/df), Z standard normal, V chi-square with ``df``
    degrees of freedom: the noncentral t's two tails, integrated over V's quantiles (scipy's ``nct`` returns NaN
    at 1 df and a large noncentrality, the case of two SFT starts)."""
    crit = student_t.ppf(1.0 - alpha / 2.0, df)
    nc = delta / se

    def given(u: float) -> float:  # both tails given V at its quantile u
        # chi2.ppf(u, df) and norm.cdf as scipy.stats evaluates them (2 gammaincinv(df/2, u), ndtr), without its
        # per-call argument checks: the same numbers, and the integrand quad calls thousands of times is cheap
        scale = crit * math.sqrt(2.0 * gammaincinv(df / 2.0, u) / df)
        return ndtr(nc - scale) + ndtr(-nc - scale)

    return float(quad(given, 0.0, 1.0, limit=200, epsabs=1e-11)[0])


def detectable_difference(se: float, df: int, alpha: float, power: float = 0.8) -> float:
    """The smallest true difference δ > 0 the two-sided t test at ``alpha`` rejects with probability ``power``
    (``power_at(δ) = power``); inf when ``df`` < 1 (one unit: no test). 0 when ``se`` is 0."""
    if df < 1:
        return math.inf
    if se == 0:
        return 0.0
    hi = se
    while power_at(hi, se, df, alpha) < power:
        hi *= 2.0
    return float(brentq(lambda x: power_at(x, se, df, alpha) - power, 0.0, hi, xtol=1e-12 * se))


def design_detectable_difference(c: Components, d: Design, power: float = 0.8) -> tuple[float, float, int]:
    """(detectable difference at ``power``, its se, df) of design ``d`` under components ``c``, tested at
    alpha / family (Holm's first step)."""
    se, df = standard_error(c, d), degrees_of_freedom(d)
    return detectable_difference(se, df, d.alpha / d.family, power), se, df
