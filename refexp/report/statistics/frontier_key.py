"""A frontier read along its key (``comparison.matched.along: key``): in each replicate, the arm's runs taken in
frontier-key order (β) form a path through (x, accuracy), and a matched x is read between the two neighbours on the
key's grid whose final x straddle it, not between the two runs nearest in x. The two readings differ where drift is
not monotone in the key (why it can fail to be: ``comparison.matched.along`` in docs/options.md).
"""

from __future__ import annotations

from typing import Optional

from refexp.report.statistics.frontier_points import Curves, Point
from refexp.report.statistics.paired import Unit


def key_crossing(points: list[Point], x: float) -> Optional[list[Point]]:
    """The two neighbours on the frontier key's grid whose final x straddle ``x``, sorted by x (the pair at the
    largest key where the runs, walked along the key, cross ``x`` more than once); None where they never do."""
    pts = sorted(points, key=lambda p: p.value)
    for a, b in reversed(list(zip(pts, pts[1:]))):
        if min(a.x, b.x) * (1 - 1e-9) <= x <= max(a.x, b.x) * (1 + 1e-9):
            return sorted((a, b), key=lambda p: (p.x, p.value))
    return None


def along_key(curve: dict[Unit, list[Point]], seeds: list[Unit], x: float) -> Optional[dict[Unit, list[Point]]]:
    """Each replicate's points cut to its ``key_crossing`` at ``x`` (``comparison.matched.along: key``); None where
    some replicate's runs never cross it."""
    cut = {s: key_crossing(curve[s], x) for s in seeds}
    return None if any(v is None for v in cut.values()) else cut


def cut_along_key(cs: Curves, base: str, label: str, seeds: list[Unit], x: float) -> Curves:
    """``cs`` with the baseline's and ``label``'s curves cut to each replicate's ``key_crossing`` at ``x``
    (``comparison.matched.along: key``), where the interpolation reads them; every replicate's curves must cross
    ``x`` (``reading_rules.replicate_problem`` checked it first)."""
    arm_k, base_k = along_key(cs[label], seeds, x), along_key(cs[base], seeds, x)
    if arm_k is None or base_k is None:
        raise ValueError(f"a replicate's runs never cross {x} along the key: check reading_rules first")
    return {**cs, label: arm_k, base: base_k}


def key_symbol(key: str) -> str:
    """``algo.beta`` -> β; another key as it is."""
    return "β" if key.rsplit(".", 1)[-1] == "beta" else key
