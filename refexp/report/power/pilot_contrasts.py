"""What the pilot's own paired readings say about a matched contrast's spread, and the power it gives a design.

Each pilot replicate (SFT start, seed) whose arm and baseline curves the report's rule reads at the declared value
(``simulate.read_replicate``: ``statistics/reading_rules.py``) gives one difference d[s, k] = y_arm − y_baseline, with
everything the report will see inside it: the drift's measurement noise, the interpolation, and the start both arms
share, which cancels. The simulation (``simulate.py``) draws each arm's start effect on its own and so counts a
shared start twice; these paired components do not. Nested moments split d's spread: the seeds' variance pooled
within starts, and the variance of the start means (S_p − 1 degrees of freedom), which holds the start effect plus
the seeds' share of it. A design of S starts × K seeds then has var(d̄) = v_start / S + v_seed / (S K), with
v_start the start means' variance less v_seed / K_p (K_p the pilot's seeds per start), the means' variance taken as
at least v_seed / K_p (what the seeds alone give them).

A pilot of few starts measures v_start loosely (two starts: one degree of freedom), so the plan's power uses each
variance's one-sided 80% upper confidence bound, (df · v) / χ²_{0.2, df} (v_start's from the means' bound, less the
seeds' point share): a design sized at that bound reaches its
power in at least 80% of pilots (Browne 1995, "On the use of a pilot sample for sample size determination",
Statistics in Medicine 14:1933). A design over one start tests over its seeds: v_seed alone, from the pilot's start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
from scipy.stats import chi2

from refexp.report.power.detectable import detectable_difference, power_at
from refexp.report.power.pilot_runs import PilotRuns
from refexp.report.power.simulate import Rules, read_replicate

UPPER = 0.8
"""The one-sided confidence of each variance's upper bound (Browne 1995's recommendation)."""


def upper_bound(var: float, df: int, level: float = UPPER) -> float:
    """The one-sided ``level`` upper confidence bound of a variance estimated with ``df`` degrees of freedom."""
    return df * var / float(chi2.ppf(1.0 - level, df))


@dataclass
class PairedReadings:
    """The pilot's readable differences of one contrast at one value, by SFT start."""

    by_start: dict[str, list[float]]
    unreadable: int

    @property
    def differences(self) -> list[float]:
        return [d for ds in self.by_start.values() for d in ds]

    @property
    def mean(self) -> float:
        return float(np.mean(self.differences)) if self.differences else math.nan

    def _seed(self) -> tuple[float, int]:
        """(pooled within-start variance, its df)."""
        groups = [np.asarray(ds) for ds in self.by_start.values() if len(ds) >= 2]
        df = sum(len(g) - 1 for g in groups)
        if df == 0:
            return math.nan, 0
        return float(sum(((g - g.mean()) ** 2).sum() for g in groups) / df), df

    def components(self, upper: bool) -> Optional[tuple[float, float]]:
        """(v_start, v_seed) (module doc), each at its upper bound when ``upper``; None: not estimable (no start
        with two readable differences); v_start nan with one start (a design over one start needs v_seed alone)."""
        means = [float(np.mean(ds)) for ds in self.by_start.values() if ds]
        v_seed, seed_df = self._seed()
        if seed_df == 0:
            return None
        if len(means) < 2:
            return math.nan, upper_bound(v_seed, seed_df) if upper else v_seed
        per_start = float(np.mean([len(ds) for ds in self.by_start.values() if ds]))
        # the seeds alone make the start means vary by v_seed / K_p: a smaller observed spread is luck, not evidence
        v_means, start_df = max(float(np.var(means, ddof=1)), v_seed / per_start), len(means) - 1
        if upper:
            return max(upper_bound(v_means, start_df) - v_seed / per_start, 0.0), upper_bound(v_seed, seed_df)
        return v_means - v_seed / per_start, v_seed

    def se(self, starts: int, seeds: int, upper: bool) -> float:
        """The standard error of a design's mean difference over ``starts`` × ``seeds``; nan when not estimable."""
        c = self.components(upper)
        if c is None:
            return math.nan
        if starts == 1:  # the t is over the seeds of the one start
            return math.sqrt(c[1] / seeds)
        return math.sqrt(c[0] / starts + c[1] / (starts * seeds))  # nan where v_start is not estimable


def paired_readings(pilot: PilotRuns, baseline: str, arm: str, at: float, rules: Rules) -> PairedReadings:
    """Each pilot replicate with runs of both arms read at ``at`` by the report's rule (module doc)."""
    curves: dict[tuple, dict[str, list]] = {}
    for r in pilot.runs:
        if r.arm in (baseline, arm):
            curves.setdefault((r.start, r.seed), {}).setdefault(r.arm, []).append(r)
    by_start: dict[str, list[float]] = {}
    unreadable = 0
    for (start, _), arms in sorted(curves.items()):
        if len(arms) < 2:
            continue
        values = []
        for a in (arm, baseline):
            runs = arms[a]
            why, y = read_replicate(np.array([r.key for r in runs]), np.array([r.x for r in runs]),
                                    np.array([r.y for r in runs]), at, rules)
            values.append(None if why is not None else y)
        if None in values:
            unreadable += 1
            continue
        by_start.setdefault(start, []).append(values[0] - values[1])
    return PairedReadings(by_start, unreadable)


def paired_power(p: PairedReadings, starts: int, seeds: int, margin: float, alpha: float,
                 power: float = 0.8) -> tuple[float, float, float]:
    """(se, power at ``margin``, the difference detected with ``power``) of the design's t over its starts at
    ``alpha`` (Holm's first step), at the variances' upper bounds; nans when not estimable."""
    se = p.se(starts, seeds, upper=True)
    df = starts - 1 if starts >= 2 else seeds - 1
    if se != se or df < 1:
        return math.nan, math.nan, math.nan
    return se, power_at(margin, se, df, alpha) if se > 0 else 1.0, detectable_difference(se, df, alpha, power)


def paired_section(runs: PilotRuns, baseline: str, arms: list[str], values: list[float], rules: Rules, axis: str,
                   starts: int, seeds: int, margin: Optional[float], alpha: float) -> tuple[list[str], dict]:
    """The plan's lines for the pilot's paired readings (module doc) of each contrast on the frontier, and
    {(arm, value): power at the margin at the variances' upper bounds} where estimable."""
    lines = ["", "### The pilot's own paired readings (frontier)", "",
             f"Each pilot replicate read at the value by the report's rule on the pilot's own runs, arm − {baseline} "
             f"(`refexp/report/power/pilot_contrasts.py`): their start and seed variances, and the design's "
             f"({starts} SFT start{'s' * (starts != 1)} × {seeds} seeds) standard error and power at the margin at the "
             f"point estimates and at each variance's one-sided {UPPER:.0%} upper bound (Browne 1995), the t over the "
             f"{'starts' if starts >= 2 else 'seeds'} at alpha {alpha:.4g}. The power the plan's answer reads is the "
             f"bound's: it counts the start both arms share once, as the report's paired difference does, where the "
             f"simulation above draws each arm's apart.", "",
             "| contrast | pilot replicates read | mean difference (per start) | start var, seed var: point; bound | "
             "se: point; bound | power at the margin: point; bound | detectable (80%), bound |",
             "|:---|---:|:---|:---|:---|:---|---:|"]
    powers = {}
    for arm in arms:
        for at in values:
            p = paired_readings(runs, baseline, arm, at, rules)
            read = f"{len(p.differences)} of {len(p.differences) + p.unreadable}"
            per_start = ", ".join(f"{np.mean(ds):+.3f}" for ds in p.by_start.values() if ds)
            point, bound = p.components(upper=False), p.components(upper=True)
            label = f"{arm} - {baseline} at {axis} {at:.3g}"
            if point is None or (starts >= 2 and point[0] != point[0]):
                lines.append(f"| {label} | {read} | {p.mean:+.3f} ({per_start}) | not estimable (a start with two "
                             + ("readings" if starts == 1 else "readings and two starts with one")
                             + " needed) | - | - | - |")
                continue
            df = starts - 1 if starts >= 2 else seeds - 1
            se_point = p.se(starts, seeds, upper=False)
            se, pw, mdd = paired_power(p, starts, seeds, margin if margin is not None else math.nan, alpha)
            pw_point = power_at(margin, se_point, df, alpha) if margin is not None and se_point > 0 else math.nan
            if margin is not None:
                powers[(arm, at)] = pw
            v = lambda x: "-" if x != x else f"{x:.3g}"  # noqa: E731
            lines.append(f"| {label} | {read} | {p.mean:+.3f} ({per_start}) | {v(point[0])}, {v(point[1])}; "
                         f"{v(bound[0])}, {v(bound[1])} | {se_point:.3f}; {se:.3f} | "
                         + (f"{pw_point:.2f}; {pw:.2f}" if margin is not None else "-") + f" | ±{mdd:.3f} |")
    return lines, powers
