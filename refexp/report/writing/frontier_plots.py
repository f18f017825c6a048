"""The frontier plot: each arm's final accuracy against its final x (``kl/init``, or ``eval/retention``) at each
value of the frontier key, the mean over its runs (SFT starts x seeds) with 95% intervals on both axes, joined
in the key's order.

Same conventions as ``plots.py`` (object API on Agg, one colour per strategy).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from refexp.report.statistics.frontier_points import Axis, Curves
from refexp.report.statistics.stats import replicate_ci
from refexp.report.writing.plots import STRATEGY_COLOURS, _figure, _save

_SPARE = ("C4", "C5", "C6", "C8", "C9")


def _colour(strategy: str, used: set) -> str:
    """The strategy's colour, a spare one for a second arm of the same strategy (two reset intervals)."""
    c = STRATEGY_COLOURS.get(strategy)
    if c is None or c in used:
        c = next((s for s in _SPARE if s not in used), "k")
    used.add(c)
    return c


def plot_frontier_curves(path: Path, cs: Curves, axis: Axis, metric: str, key: str) -> Optional[Path]:
    """One line per arm through its (mean x, mean accuracy) at each value of ``key``; None when no arm has one."""
    fig, ax = _figure(f"{metric} vs {axis.key} across {key} (mean, 95% CI across runs)",
                      f"{axis.key} (final)" + (", log scale" if axis.log else ""), f"{metric} (final)")
    used: set = set()
    drawn = False
    for arm, by_seed in cs.items():
        by_value: dict[float, list] = {}
        for pts in by_seed.values():
            for p in pts:
                by_value.setdefault(p.value, []).append(p)
        strategy = next(p.run.strategy for pts in by_seed.values() for p in pts)
        colour = _colour(strategy, used)
        xs, ys = [], []
        for value in sorted(by_value):
            pts = by_value[value]  # the start is the replicate where the runs come from several
            x = replicate_ci((p.run.sft_start, p.x) for p in pts)
            y = replicate_ci((p.run.sft_start, p.y) for p in pts)
            ax.errorbar([x.mean], [y.mean], xerr=[x.half_width or 0.0], yerr=[y.half_width or 0.0], color=colour,
                        marker="o", markersize=4, capsize=3, linestyle="none")
            ax.annotate(f"{value:g}", (x.mean, y.mean), textcoords="offset points", xytext=(4, 4),
                        fontsize="x-small", color=colour)
            xs.append(x.mean)
            ys.append(y.mean)
        ax.plot(xs, ys, color=colour, label=f"{arm} (n={len(by_seed)} runs)")
        drawn = True
    if axis.log and drawn:
        ax.set_xscale("log")
    return _save(fig, ax, path) if drawn else None
