"""β grids under which a matched design can answer: per arm, the cheapest simple grid whose simulated replicates
fail the report's reading rule so rarely that the whole design's P(no claim) stays within ``TARGET``.

A contrast makes no claim where any of its R = starts × seeds replicates fails for either arm, so with the arms
independent P(no claim) = 1 - (1 - q_base)(1 - q_arm), q an arm's P(some replicate fails); each arm is held to
q <= 1 - sqrt(1 - TARGET) (0.106 at 0.2), which keeps every contrast within the target. The candidates are
geometric grids around β*, where the arm's fitted drift reaches the declared value (the largest such β where it is
flat there): ratios from ``comparison.frontier_gap`` (the β rule's widest step) down to 1.5, 3 to 9 points,
centred on β* or half a step above; the first (fewest runs) that passes is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from refexp.report.power.fit import ArmFit, to_t
from refexp.report.power.simulate import Reader, draw_arm

TARGET = 0.2
SIZES = range(3, 10)
RATIOS = (2.5, 2.0, 1.5)
SWEEPS = 200
"""Simulated sweeps per candidate grid (the chosen grids are checked again with the full count)."""


@dataclass
class GridChoice:
    arm: str
    key_at: Optional[float]
    """β* (module doc); None: the fitted drift never reaches the value."""
    grid: Optional[list[float]]
    """None: no candidate passed."""
    q: float
    """P(some replicate fails) under ``grid`` (under the widest candidate tried where none passed)."""
    beyond: bool = False
    """Whether the grid leaves the pilot's β range (its drift there extrapolated along the fit's end segments)."""


def per_arm_target(target: float = TARGET) -> float:
    """q an arm may have so that two arms' contrast stays within ``target``."""
    return 1.0 - math.sqrt(1.0 - target)


def _round(b: float) -> float:
    return float(f"{b:.2g}")


def candidates(key_at: float, gap: float) -> list[list[float]]:
    """Geometric grids around ``key_at`` (module doc), fewest points first, each step within ``gap``."""
    out = []
    for n in SIZES:
        for ratio in sorted({r for r in RATIOS if r <= gap} | {gap}, reverse=True):
            for offset in (0.0, 0.5):
                g = sorted({_round(key_at * ratio ** (k - (n - 1) / 2 + offset)) for k in range(n)})
                if len(g) == n and all(b / a <= gap * (1 + 1e-9) for a, b in zip(g, g[1:])):
                    out.append(g)
    return out


def arm_failure(fit: ArmFit, grid: list[float], starts: int, seeds: int, at: list[float], reader: Reader,
                sweeps: int, seed: int) -> float:
    """P(some replicate of the arm fails at some declared value) over ``sweeps`` simulated sweeps."""
    d = draw_arm(fit, grid, starts, seeds, sweeps, np.random.default_rng(seed))
    return float(np.mean([any(w is not None for x in at for w in reader(d, i, x)[0]) for i in range(sweeps)]))


def choose_grid(fit: ArmFit, starts: int, seeds: int, at: list[float], gap: float, reader: Reader,
                target: float = TARGET, sweeps: int = SWEEPS, seed: int = 0) -> GridChoice:
    """The first candidate grid (fewest runs) whose simulated q is within ``per_arm_target(target)``."""
    t_mid = float(np.mean(to_t(np.asarray(at), fit.log)))
    key_at = fit.key_at(t_mid)
    if key_at is None:
        return GridChoice(fit.arm, None, None, 1.0)
    limit, last = per_arm_target(target), (None, 1.0)
    lo, hi = math.exp(fit.log_keys[0]), math.exp(fit.log_keys[-1])
    for g in candidates(key_at, gap):
        q = arm_failure(fit, g, starts, seeds, at, reader, sweeps, seed)
        if q <= limit:
            return GridChoice(fit.arm, key_at, g, q, g[0] < lo * 0.999 or g[-1] > hi * 1.001)
        last = (g, q)
    return GridChoice(fit.arm, key_at, None, last[1])
