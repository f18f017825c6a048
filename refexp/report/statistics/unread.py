"""Why a matched contrast makes no claim: every replicate whose curve of either arm cannot be read at the value
(``reading_rules.replicate_problem``), counted by reason for each arm, with one of them as an example in numbers.

    not matched at kl/init 0.3: 7 of 24 replicates fail (the baseline gap too wide on kl/init (> 2x) in 3, ema
    outside its runs' range in 4); e.g. the baseline's runs in SFT start s0, seed 1 around it sit at kl/init 0.087
    (β 0.5) and 0.956 (β 0.2), 11x apart; a matched value is never extrapolated
"""

from __future__ import annotations

from collections import Counter
from typing import Optional

from refexp.report.statistics.frontier_key import key_symbol
from refexp.report.statistics.frontier_points import Axis, Point
from refexp.report.statistics.paired import Unit
from refexp.report.statistics.reading_rules import REASONS, read_between, replicate_problems


def replicate_name(unit: Unit) -> str:
    """(SFT start, seed) -> "SFT start s0, seed 1" ("seed 1" without a named start)."""
    start, seed = unit
    return f"{f'SFT start {start}, ' if start else ''}seed {seed}"


def gap_text(max_gap: float, log: bool) -> str:
    """``comparison.matched.max_gap`` as a bound: "2x" (a ratio, log axis) or "0.1" (a difference)."""
    return f"{max_gap:g}x" if log else f"{max_gap:g}"


def _reason(code: str, axis: Axis, key: str, key_gap: float, max_gap: Optional[float]) -> str:
    sym = key_symbol(key)
    return {"outside": "outside its runs' range",
            "axis_gap": f"gap too wide on {axis.key} (> {gap_text(max_gap or 0.0, axis.log)})",
            "key_gap": f"gap too wide in {sym} (> {key_gap:g}x)",
            "order": f"order reversed (its runs, walked along {sym}, never cross it)"}.get(code, REASONS[code])


def _example(who: str, pts: list[Point], unit: Unit, code: str, x: float, axis: Axis, key: str, key_gap: float,
             along: str) -> str:
    """One failing replicate in numbers: where its runs ended, or the two it would be read between."""
    sym, rep = key_symbol(key), replicate_name(unit)
    if code == "outside":
        if not pts:
            return f"{who} has no run in {rep}"
        lo, hi = min(p.x for p in pts), max(p.x for p in pts)
        return f"{who}'s runs in {rep} reached {axis.key} {lo:.3g} to {hi:.3g}"
    if code == "order":
        ends = ", ".join(f"{p.x:.3g}" for p in sorted(pts, key=lambda p: p.value))
        return f"{who}'s runs in {rep}, walked along {sym}, end at {axis.key} {ends}"
    a, b = read_between(pts, x, axis.log, along)
    if code == "key_gap":
        hi, lo = sorted((a.value, b.value), reverse=True)
        return f"{who} has no run between {sym} {hi:g} and {lo:g} in {rep} (runs more than {key_gap:g}x apart)"
    step = f"{b.x / a.x:.3g}x" if axis.log else f"{b.x - a.x:.3g}"
    return (f"{who}'s runs in {rep} around it sit at {axis.key} {a.x:.3g} ({sym} {a.value:g}) and {b.x:.3g} "
            f"({sym} {b.value:g}), {step} apart")


def unread(curves: list[tuple[str, dict[Unit, list[Point]]]], seeds: list[Unit], x: float, axis: Axis,
           key_gap: float, max_gap: Optional[float], along: str, key: str) -> str:
    """Why ``x`` is not read on ``curves`` ((who, its curve by replicate): the baseline's and the arm's) over
    ``seeds``: how many replicates fail, each arm's count by reason, and the first failing one's numbers; "" when
    every replicate of every curve can be read there."""
    problems = [(who, curve, replicate_problems(curve, seeds, x, axis.log, key_gap, max_gap, along))
                for who, curve in curves]
    failing = {s for _, _, p in problems for s in p}
    if not failing:
        return ""
    counts = []
    for who, _, p in problems:
        by = Counter(p.values())
        counts += [f"{who} {_reason(code, axis, key, key_gap, max_gap)} in {by[code]}" for code in REASONS if by[code]]
    who, curve, p = next(t for t in problems if t[2])
    unit, code = next(iter(p.items()))
    example = _example(who, curve.get(unit, []), unit, code, x, axis, key, key_gap, along)
    return (f"not matched at {axis.key} {x:.3g}: {len(failing)} of {len(seeds)} replicates fail ({', '.join(counts)});"
            f" e.g. {example}; a matched value is never extrapolated")
