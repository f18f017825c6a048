"""The first screen's picture: each primary contrast's Δ and interval against the ±margin band (a forest plot), so
the verdict is seen before it is read.

One row per primary contrast, top to bottom in the first screen's order: its point difference, the family's
simultaneous (Bonferroni, 1 − alpha/m) interval the table prints as a thin bar, and, where an equivalence margin is
declared, the two one-sided tests' (1 − 2 alpha/m) interval the *equivalent* verdict reads as a thick one, over the
shaded ±margin band and the zero line; the verdict word at the row's right. A contrast without a claim has no
interval and says so on its row. Same conventions as ``plots.py`` (object API on Agg, fixed margins).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from matplotlib.figure import Figure
from matplotlib.transforms import blended_transform_factory

PLOT = "primary_contrasts.png"
"""The file under the report's plots dir."""


@dataclass(frozen=True)
class ForestRow:
    """One primary contrast as the forest plot draws it."""

    label: str
    """The contrast and its endpoint ("ema − fixed's frontier, eval/accuracy at matched kl/init 2.15")."""
    verdict: str
    """The verdict word ("higher", "equivalent within ±0.05", "inconclusive", "no claim")."""
    point: Optional[float] = None
    """Δ, arm − baseline; None: no claim, nothing drawn but the words."""
    interval: Optional[tuple[float, float]] = None
    """The simultaneous (Bonferroni, 1 − alpha/m) interval."""
    level: Optional[float] = None
    """Its coverage, 1 − alpha/m."""
    equivalence: Optional[tuple[float, float]] = None
    """The two one-sided tests' (1 − 2 alpha/m) interval, where a margin is declared."""
    equivalence_level: Optional[float] = None


def caption(rows: Sequence[ForestRow], margin: Optional[float]) -> str:
    """What the picture shows, its intervals' levels named."""
    levels = sorted({r.level for r in rows if r.level is not None}, reverse=True)
    tost = sorted({r.equivalence_level for r in rows if r.equivalence_level is not None}, reverse=True)
    text = "Primary contrasts: Δ (dot)"
    if levels:
        text += (f", simultaneous (Bonferroni) {' / '.join(f'{100 * v:.4g}%' for v in levels)} interval (thin bar, "
                 f"the table's)")
    if tost:
        text += (f", equivalence tests' {' / '.join(f'{100 * v:.4g}%' for v in tost)} interval (thick bar, what "
                 f"the equivalent verdict reads)")
    text += (f", equivalence margin ±{margin:g} shaded" if margin is not None else ", no equivalence margin declared")
    return text + "; the verdict at the right of each row"


def plot_forest(path: Path, rows: Sequence[ForestRow], margin: Optional[float]) -> Optional[Path]:
    """The forest plot of ``rows`` into ``path`` (PNG); None without a row."""
    if not rows:
        return None
    height = 1.3 + 0.55 * len(rows)
    fig = Figure(figsize=(9.0, height), dpi=100)
    fig.subplots_adjust(left=0.36, right=0.76, top=1 - 0.45 / height, bottom=0.75 / height)
    ax = fig.add_subplot()
    ax.set_title("Primary contrasts: Δ and simultaneous interval", fontsize="medium")
    ax.set_xlabel("Δ, arm − baseline" + (f" (shaded: the ±{margin:g} equivalence margin)" if margin is not None
                                         else ""))
    ax.grid(axis="x", alpha=0.3)
    if margin is not None:
        ax.axvspan(-margin, margin, color="C2", alpha=0.15, linewidth=0)
    ax.axvline(0.0, color="k", linewidth=0.8)
    words = blended_transform_factory(ax.transAxes, ax.transData)
    ys = list(range(len(rows)))[::-1]  # the first row on top
    for y, r in zip(ys, rows):
        ax.text(1.02, y, r.verdict, transform=words, va="center", fontsize="small")
        if r.point is None:
            ax.text(0.5, y, "no claim: no interval", transform=words, ha="center", va="center", fontsize="small",
                    color="0.4", bbox={"facecolor": "white", "edgecolor": "none"})
            continue
        if r.interval is not None:
            ax.hlines(y, *r.interval, color="C0", linewidth=1.2)
        if r.equivalence is not None:
            ax.hlines(y, *r.equivalence, color="C0", linewidth=4.5, alpha=0.6)
        ax.plot([r.point], [y], "o", color="C0", markersize=6)
    ax.set_yticks(ys, [r.label for r in rows], fontsize="small")
    ax.set_ylim(-0.7, len(rows) - 0.3)
    if margin is not None:  # the band in view even where every interval lies inside it
        lo, hi = ax.get_xlim()
        ax.set_xlim(min(lo, -1.3 * margin), max(hi, 1.3 * margin))
    fig.savefig(path, format="png")
    return path
