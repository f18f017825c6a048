"""A frontier read along its key (``comparison.matched.along: key``): in each replicate, the arm's runs taken in
frontier-key order (β) form a path through (x, accuracy), and a matched x is read between the two neighbours on the
key's grid whose final x straddle it, not between the two runs nearest in x. The two readings differ where drift is
not monotone in the key (why it can fail to be: ``comparison.matched.along`` in docs/options.md).
"""

from __future__ import annotations

from typing import Optional

from refexp.report.statistics.frontier_points import Axis, Curves, Point
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


def cut_along_key(cs: Curves, base: str, label: str, seeds: list[Unit], x: float, axis: Axis,
                  key: str) -> tuple[Curves, str]:
    """``cs`` with the baseline's and ``label``'s curves cut to each replicate's ``key_crossing`` at ``x``
    (``comparison.matched.along: key``), and ""; else ``cs`` unchanged and ``uncrossed``'s reason."""
    arm_k, base_k = along_key(cs[label], seeds, x), along_key(cs[base], seeds, x)
    if arm_k is None or base_k is None:
        return cs, uncrossed(cs[label], cs[base], label, seeds, x, axis, key)
    return {**cs, label: arm_k, base: base_k}, ""


def uncrossed(arm_c, base_c, arm: str, seeds: list[Unit], x: float, axis: Axis, key: str) -> str:
    """Why ``x`` is not read along the key: in how many replicates either curve's runs, walked along it, never
    cross ``x``, and the first one; "" when every replicate's curves cross it."""
    parts = []
    for who, c in (("the baseline", base_c), (arm, arm_c)):
        out = [s for s in seeds if key_crossing(c[s], x) is None]
        if out:
            start, seed = out[0]
            ends = ", ".join(f"{p.x:.3g}" for p in sorted(c[out[0]], key=lambda p: p.value))
            parts.append(f"{who}'s runs, walked along {key_symbol(key)}, cross it in {len(seeds) - len(out)} of "
                         f"{len(seeds)} replicates (not in {f'SFT start {start}, ' if start else ''}seed {seed}: "
                         f"{ends})")
    if not parts:
        return ""
    return f"not matched at {axis.key} {x:.3g}: {' and '.join(parts)}; a matched value is never extrapolated"


def key_symbol(key: str) -> str:
    """``algo.beta`` -> β; another key as it is."""
    return "β" if key.rsplit(".", 1)[-1] == "beta" else key
