"""The report's section on Gao et al.'s RL form (``statistics/gao.py``): a table of each reference strategy's fitted
parameters with their intervals, the fitted curves over the points in one plot, and summary.json's ``gao``. Written
only when counted runs log ``eval/gold`` and ``kl/init``; descriptive and secondary, so it carries no verdict."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
from matplotlib.figure import Figure

from refexp.report.reading.comparison_plan import ComparisonPlan
from refexp.report.reading.load import Run
from refexp.report.sections.base import Section, Sweep
from refexp.report.statistics import gao
from refexp.report.writing.blocks import Heading, Image, Paragraph, table_of

TITLE = "Gold against drift: Gao et al.'s RL form per reference strategy"
PLOT = "gao_fit.png"
HEADER = ["reference strategy", "α_RL", "β_RL", "d* (peak)", "R* (Δgold at d*)", "R²", "points (runs, replicates)"]


@dataclass
class GaoSection:
    """The fits, their plot and the section's text."""

    fits: list[gao.GaoFit]
    text: str
    plot: Optional[Path] = None
    level: float = 0.95
    grouping: str = field(default="")


def make(runs: list[Run], plan: ComparisonPlan, plots_dir: Path) -> Optional[GaoSection]:
    """The section, or None when no counted completed run logged ``eval/gold`` and ``kl/init``."""
    fits = gao.fits(runs, plan)
    if not fits:
        return None
    key = (plan.block or {}).get("frontier_key")
    grouping = f"each arm's counted runs across {key}" if key else "each report group's counted runs"
    section = GaoSection(fits, _text(fits, grouping, 1 - plan.alpha), level=1 - plan.alpha, grouping=grouping)
    if any(not f.no_fit for f in fits):
        plots_dir.mkdir(parents=True, exist_ok=True)
        section.plot = _plot(plots_dir / PLOT, fits)
    return section


def _text(fits: list[gao.GaoFit], grouping: str, level: float) -> str:
    methods = sorted({_method(f) for f in fits if not f.no_fit})
    return (
        "Descriptive and secondary: not a pre-registered contrast, so no verdict is drawn from it. Gao, Schulman and "
        "Hilton 2022 (\"Scaling Laws for Reward Model Overoptimization\", eq. 2) find the gold reward of RL against "
        "a proxy follows d (α_RL − β_RL log d) in d = √KL(policy ‖ init). "
        f"Here {grouping} are pooled, every evaluation after step 0 a point (d = √kl/init, Δgold = eval/gold "
        "minus the run's step-0 eval/gold, "
        "since refexp's gold starts at the start's gold, not 0), and α_RL, β_RL (the paper's α, β; not algo.beta) "
        "are fitted by least squares to Δgold = α_RL d − β_RL d log d. d* = exp(α_RL/β_RL − 1) is where the fitted "
        "Δgold peaks and R* = β_RL d* its height; β_RL ≤ 0 has no peak (the fitted gold never turns down: ∞), and a "
        "d* beyond the largest d observed is extrapolated. R² is 1 − SS_res/SS_tot about the points' mean Δgold. "
        "kl/init is a mean per-token KL, not the paper's per-sequence KL, so the parameters are in its units. "
        f"Intervals: {100 * level:g}% {'; '.join(methods) or 'percentile bootstrap'}; the prompts are not resampled. "
        "Over few replicates such an interval is too narrow: in a simulation of this form (tests/test_report_gao.py) "
        "a nominal 95% interval covered the truth about 73% of the time with 3 replicates and 87% with 6.")


def _method(f: gao.GaoFit) -> str:
    levels = [f"{lvl}s" for lvl in f.levels]
    what = levels[0] if len(levels) == 1 else f"{levels[0]}, then {levels[1]} within start"
    return f"percentile bootstrap over {what} (each drawn replicate brings all its runs' points), B={f.n_boot}"


def _num(x: float) -> str:
    return "∞" if math.isinf(x) else "—" if math.isnan(x) else f"{x:.3g}"


def _cell(f: gao.GaoFit, name: str) -> str:
    value = getattr(f, name)
    lo, hi = f.intervals.get(name, (math.nan, math.nan))
    return f"{_num(value)} [{_num(lo)}, {_num(hi)}]"


def rows(section: GaoSection) -> list[list[str]]:
    out = []
    for f in section.fits:
        counts = f"{f.points} ({f.runs} runs, {f.replicates} replicates)"
        if f.no_fit:
            out.append([f.label, "—", "—", "—", "—", "—", f"{counts}; no fit: {f.no_fit}"])
            continue
        beyond = f" (beyond the largest d, {f.d_max:.3g})" if f.d_max < f.d_star < math.inf else ""
        d_star = _cell(f, "d_star") + beyond
        out.append([f.label, _cell(f, "alpha_rl"), _cell(f, "beta_rl"), d_star, _cell(f, "r_star"), _num(f.r2), counts])
    return out


def _plot(path: Path, fits: list[gao.GaoFit]) -> Optional[Path]:
    """Each fitted strategy's points (d, Δgold) and its fitted curve over [0, its largest d], one colour each."""
    fig = Figure(figsize=(7.5, 4.5), dpi=100)
    fig.subplots_adjust(left=0.11, right=0.97, top=0.92, bottom=0.11)
    ax = fig.add_subplot()
    ax.set_title("Δgold vs √kl/init with Gao et al.'s RL form fitted per strategy", fontsize="medium")
    ax.set_xlabel("d = √kl/init")
    ax.set_ylabel("Δgold (eval/gold − step 0)")
    ax.grid(alpha=0.3)
    ax.axhline(0.0, color="k", linewidth=0.6)
    for i, f in enumerate(x for x in fits if not x.no_fit):
        colour = f"C{i % 10}"
        ax.scatter(f.d, f.dgold, color=colour, s=9, alpha=0.5)
        grid = np.linspace(0.0, f.d_max, 200)
        ax.plot(grid, gao.curve(f.alpha_rl, f.beta_rl, grid), color=colour,
                label=f"{f.label}: α_RL {f.alpha_rl:.3g}, β_RL {f.beta_rl:.3g}")
        if f.d_star <= f.d_max:
            ax.plot([f.d_star], [f.r_star], color=colour, marker="*", markersize=11, linestyle="none")
    ax.legend(fontsize="small", loc="best")
    fig.savefig(path, format="png")
    return path


def _finite(x: float) -> Optional[float]:
    """A number for summary.json: inf (no peak) and NaN are null there (``allow_nan=False``)."""
    return float(x) if math.isfinite(x) else None


def summary(section: GaoSection, sweep_dir: Path) -> dict:
    """The numbers for summary.json; an interval end or a peak that is inf (no peak) is null, with ``has_peak``."""
    return {
        "role": "descriptive", "form": "delta_gold = alpha_rl*d - beta_rl*d*log(d), d = sqrt(kl/init)",
        "grouping": section.grouping, "level": section.level, "text": section.text,
        "plot": None if section.plot is None else section.plot.relative_to(sweep_dir).as_posix(),
        "fits": [{"label": f.label, "runs": f.runs, "replicates": f.replicates, "points": f.points,
                  "no_fit": f.no_fit or None,
                  **({} if f.no_fit else {
                      **{k: _finite(getattr(f, k)) for k in gao.PARAMETERS},
                      "intervals": {k: [_finite(lo), _finite(hi)] for k, (lo, hi) in f.intervals.items()},
                      "has_peak": math.isfinite(f.d_star), "peak_beyond_data": bool(f.d_max < f.d_star < math.inf),
                      "r2": _finite(f.r2), "d_max": f.d_max, "no_peak_share": _finite(f.no_peak_share),
                      "bootstrap": {"levels": list(f.levels), "n_boot": f.n_boot}})}
                 for f in section.fits]}


class Gao(Section):
    name = "gao"

    def compute(self, sweep: Sweep) -> Optional[GaoSection]:
        return make(sweep.runs, sweep.plan, sweep.plots_dir)

    def blocks(self, report) -> list:
        section = report.gao
        if section is None:
            return []
        out = [Heading(TITLE), Paragraph(section.text), table_of(HEADER, rows(section))]
        if section.plot is not None:
            out.append(Image(section.plot, "Δgold vs √kl/init, Gao et al.'s form", html_alt="gao fit"))
        return out

    def summary(self, report) -> dict:
        return {"gao": None if report.gao is None else summary(report.gao, report.sweep_dir)}
