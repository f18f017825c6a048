"""Numbers across seeds (or SFT starts): Student-t confidence intervals and per-step seed bands.

The t and normal quantiles come from ``scipy.stats``. Intervals here are over seeds only; paired
differences that also carry the test prompts' sampling noise are ``bootstrap.py``'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Hashable, Iterable, Optional, Sequence

import numpy as np
from scipy.stats import norm
from scipy.stats import t as student_t


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    return float(student_t.cdf(t, df))


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with ``df`` degrees of freedom (e.g. t_quantile(0.975, 2) = 4.303)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p={p!r} must lie in (0, 1)")
    if df <= 0:
        raise ValueError(f"df={df!r} must be > 0")
    return float(student_t.ppf(p, df))


@dataclass(frozen=True)
class Estimate:
    """Mean across seeds with a two-sided confidence interval.

    ``half_width`` is t_{(1+c)/2, n-1} * s / sqrt(n) with s the sample std (ddof=1);
    it is None when n == 1 (one seed says nothing about seed-to-seed spread).
    """

    mean: float
    half_width: Optional[float]
    std: Optional[float]
    n: int
    values: tuple[float, ...]
    eval_prompts: Optional[int] = None
    """Set when ``half_width`` includes the evaluation's binomial noise on this many prompts
    (``with_evaluation_noise``)."""
    unit: str = "seed"
    """What one of ``values`` is: a seed's run, or (``START_UNIT``) an SFT start's mean over its runs
    (``replicate_ci``)."""

    def to_dict(self) -> dict:
        out = {"mean": _json_float(self.mean), "ci95_half_width": _json_float(self.half_width),
               "std": _json_float(self.std), "n": self.n, "values": [_json_float(v) for v in self.values]}
        if self.eval_prompts is not None:
            out["eval_prompts"] = self.eval_prompts
        if self.unit != "seed":
            out["unit"] = self.unit
        return out


START_UNIT = "SFT start"
"""``Estimate.unit`` of an interval over SFT starts."""


def _json_float(x: Optional[float]) -> Optional[float]:
    """JSON has no NaN/inf: a non-finite number is written as null."""
    if x is None or not math.isfinite(x):
        return None
    return float(x)


def with_evaluation_noise(est: Optional[Estimate], n_prompts: Optional[int], confidence: float = 0.95
                          ) -> Optional[Estimate]:
    """``est`` of an accuracy measured on the same ``n_prompts`` prompts in every run, its interval widened
    by that evaluation's binomial noise: half-width sqrt(h_seeds² + (z·sqrt(p(1-p)/N))²).

    The prompts are one sample of the task's problems shared by all seeds, so their noise does not shrink
    with more seeds (it is added, not divided by n); one seed gets the binomial interval alone. A seed-paired
    difference measures both runs on the same prompts, but its prompt noise cancels only where the two arms
    agree on a prompt; where they disagree it does not, and ``bootstrap.paired_hierarchical_bootstrap``
    (seeds, then prompts) is the interval that includes it.
    """
    if est is None or not n_prompts or not math.isfinite(est.mean):
        return est
    p = min(max(est.mean, 0.0), 1.0)
    z = float(norm.ppf(0.5 + confidence / 2.0))
    binomial = z * math.sqrt(p * (1.0 - p) / n_prompts)
    half = binomial if est.half_width is None else math.hypot(est.half_width, binomial)
    return replace(est, half_width=half, eval_prompts=n_prompts)


def mean_ci(values: Iterable[Optional[float]], confidence: float = 0.95) -> Optional[Estimate]:
    """Mean ± Student-t CI over the non-None values; None when there are none."""
    vals = tuple(float(v) for v in values if v is not None)
    n = len(vals)
    if n == 0:
        return None
    mean = float(np.mean(vals))
    if n == 1:
        return Estimate(mean, None, None, 1, vals)
    std = float(np.std(vals, ddof=1))
    half = t_quantile(0.5 + confidence / 2.0, n - 1) * std / math.sqrt(n)
    return Estimate(mean, half, std, n, vals)


def replicate_ci(values: Iterable[tuple[Hashable, Optional[float]]], confidence: float = 0.95) -> Optional[Estimate]:
    """Mean ± Student-t CI over (SFT start, value) pairs (one per run; None values dropped) with the start as the
    replicate: one start, ``mean_ci`` over the runs' values (its seeds); several, ``mean_ci`` over each start's mean
    of its runs (n starts - 1 degrees of freedom, ``unit`` ``START_UNIT``). Seeds nested in a start share it, so
    counting runs of different starts as independent replicates would make the interval too narrow
    (pseudoreplication: Hurlbert 1984, Ecol. Monogr. 54:187; ``paired.py``'s module doc)."""
    by_start: dict[Hashable, list[float]] = {}
    for start, v in values:
        if v is not None:
            by_start.setdefault(start, []).append(float(v))
    if len(by_start) <= 1:
        return mean_ci(next(iter(by_start.values()), []), confidence)
    est = mean_ci((float(np.mean(vs)) for vs in by_start.values()), confidence)
    return replace(est, unit=START_UNIT)


@dataclass(frozen=True)
class Band:
    """A metric against step across seeds: mean and spread at every step any seed logged."""

    steps: np.ndarray
    mean: np.ndarray
    std: np.ndarray   # ddof=0, so a step only one seed reached gets a zero-width band
    lo: np.ndarray    # min across seeds
    hi: np.ndarray    # max across seeds
    half95: np.ndarray
    """Half-width of the 95% Student-t interval of the mean (``mean_ci``'s), 0 where one seed reached the step."""


def seed_band(series: Sequence[tuple[np.ndarray, np.ndarray]]) -> Optional[Band]:
    """Align per-seed (steps, values) series on the union of their steps and summarise each step."""
    series = [(s, v) for s, v in series if len(s)]
    if not series:
        return None
    steps = np.unique(np.concatenate([s for s, _ in series]))
    grid = np.full((len(series), len(steps)), np.nan)
    for i, (s, v) in enumerate(series):
        grid[i, np.searchsorted(steps, s)] = v
    present = ~np.isnan(grid)
    count = present.sum(axis=0)
    filled = np.where(present, grid, 0.0)
    mean = filled.sum(axis=0) / count
    std = np.sqrt(np.where(present, (grid - mean) ** 2, 0.0).sum(axis=0) / count)
    lo = np.where(present, grid, np.inf).min(axis=0)
    hi = np.where(present, grid, -np.inf).max(axis=0)
    half95 = np.array([t_quantile(0.975, n - 1) * sd * math.sqrt(n / (n - 1)) / math.sqrt(n) if n > 1 else 0.0
                       for n, sd in zip(count, std)])  # std is ddof=0: sqrt(n/(n-1)) makes it ddof=1
    return Band(steps, mean, std, lo, hi, half95)
