"""PNG plots of one algorithm's groups (completed runs only, like the table).

Figures are built with matplotlib's object API on the Agg canvas, never through pyplot: no GUI
backend is touched, no global figure state leaks between calls, and it works on a headless node.
One colour per strategy (the same in every plot); groups of one strategy differ by line style.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
from matplotlib.figure import Figure

from refexp.report.reading.group import Group
from refexp.report.reading.load import sft_start_keys
from refexp.report.reading.reduce import ACC, PREF_ACC, ref_cost
from refexp.report.statistics.stats import replicate_ci, seed_band

STRATEGY_COLOURS = {"fixed": "C0", "periodic_reset": "C1", "ema": "C2", "kl_triggered": "C3", "none": "C7"}
"""One colour per ``REFERENCE_STRATEGIES`` entry (tests/test_config_checks.py checks the keys); none is grey."""
_SPARE_COLOURS = ("C4", "C5", "C6", "C8", "C9")
_LINESTYLES = ("-", "--", ":", "-.")
REWARD_KEYS = ("reward/mean", "rewards/margins", "rewards/accuracies")
"""The reward curve plots the first of these the algorithm logs (GRPO: reward/mean; DPO: margin)."""


def styles(groups: list[Group]) -> dict[str, tuple[str, str]]:
    """label -> (colour, line style)."""
    spare = iter(_SPARE_COLOURS * 4)
    colours = dict(STRATEGY_COLOURS)
    out, used = {}, {}
    for g in groups:
        if g.strategy not in colours:
            colours[g.strategy] = next(spare, "k")
        i = used.get(g.strategy, 0)
        used[g.strategy] = i + 1
        out[g.label] = (colours[g.strategy], _LINESTYLES[i % len(_LINESTYLES)])
    return out


def _figure(title: str, xlabel: str, ylabel: str, bottom: float = 0.11):
    # Fixed margins, not constrained/tight layout: those draw every figure twice and made the
    # report ~2x slower, and these plots have a fixed shape anyway.
    fig = Figure(figsize=(7.5, 4.5), dpi=100)
    fig.subplots_adjust(left=0.11, right=0.97, top=0.92, bottom=bottom)
    ax = fig.add_subplot()
    ax.set_title(title, fontsize="medium")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _save(fig: Figure, ax, path: Path) -> Path:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small", loc="best")
    fig.savefig(path, format="png")
    return path


def plot_vs_step(path: Path, algo: str, groups: list[Group], key: str, ylabel: str,
                 seed_lines: bool = False) -> Optional[Path]:
    """Mean across seeds with the 95% interval of the mean as a band (the table's); optionally each seed
    as a thin line.

    ``seed_lines`` is for kl/ref: a KL-triggered reset happens at a different step in each seed,
    and only the per-seed lines keep its saw-tooth visible after averaging.
    """
    st = styles(groups)
    fig, ax = _figure(f"{algo.upper()}: {key} vs step (mean, 95% CI across seeds)", "step", ylabel)
    drawn = False
    for g in groups:
        runs = g.completed
        band = seed_band(_replicate_series(runs, key))
        if band is None:
            continue
        colour, ls = st[g.label]
        if seed_lines:
            for r in runs:
                s, v = r.series(key)
                ax.plot(s, v, color=colour, linestyle=ls, linewidth=0.6, alpha=0.35)
        ax.plot(band.steps, band.mean, color=colour, linestyle=ls, label=f"{g.label} (n={len(runs)})")
        ax.fill_between(band.steps, band.mean - band.half95, band.mean + band.half95, color=colour, alpha=0.18,
                        linewidth=0)
        drawn = True
    return _save(fig, ax, path) if drawn else None


def _replicate_series(runs: list, key: str) -> list:
    """The (steps, values) series a band is taken over: each run's, or with several SFT starts each start's mean
    over its runs (the start is the replicate, ``stats.replicate_ci``)."""
    starts = sft_start_keys(runs)
    if len(starts) <= 1:
        return [r.series(key) for r in runs]
    bands = [seed_band([r.series(key) for r in runs if r.sft_start == s]) for s in starts]
    return [(b.steps, b.mean) for b in bands if b is not None]


def _final_point(group: Group, acc_key: str):
    """(kl/init Estimate, accuracy Estimate) of the group's final evaluation across its completed seeds."""
    from refexp.report.reading.reduce import Column, last
    from refexp.report.statistics.summary import column_estimate

    # the table's interval: seeds and, for the task accuracy, the evaluation's binomial noise
    column = Column(acc_key, acc_key, lambda r: last(r, acc_key), binomial=acc_key == ACC)
    acc = column_estimate(column, group.completed)
    return replicate_ci((r.sft_start, last(r, "kl/init")) for r in group.completed), acc


def plot_frontier(path: Path, algo: str, groups: list[Group], acc_key: str = ACC) -> Optional[Path]:
    """Final held-out accuracy (``acc_key``) against final drift from the SFT start (``kl/init``), one
    point per group with its 95% intervals on both axes (the table's). Up and to the left is better:
    more accuracy for less drift. One seed: a point without bars."""
    st = styles(groups)
    fig, ax = _figure(f"{algo.upper()}: final accuracy vs drift from init (mean, 95% CI across seeds)",
                      "kl/init (final)", f"{acc_key} (final)")
    drawn = False
    for g in groups:
        kl, acc = _final_point(g, acc_key)
        if kl is None or acc is None:
            continue
        colour, ls = st[g.label]
        ax.errorbar([kl.mean], [acc.mean], xerr=[kl.half_width or 0.0], yerr=[acc.half_width or 0.0],
                    color=colour, marker="o" if ls == "-" else "s", markersize=6, capsize=4, linestyle="none",
                    label=f"{g.label} (n={acc.n})")
        drawn = True
    return _save(fig, ax, path) if drawn else None


def plot_ref_cost(path: Path, algo: str, groups: list[Group]) -> Optional[Path]:
    """Share of step time in the reference forward per group, with 95% CI error bars."""
    st = styles(groups)
    labels, means, errs, colours = [], [], [], []
    for g in groups:
        est = replicate_ci((r.sft_start, ref_cost(r)) for r in g.completed)
        if est is None:
            continue
        labels.append(g.label)
        means.append(100 * est.mean)
        errs.append(100 * (est.half_width or 0.0))
        colours.append(st[g.label][0])
    if not labels:
        return None
    fig, ax = _figure(f"{algo.upper()}: reference cost (mean ± 95% CI across seeds)", "",
                      "reference forward, % of step time", bottom=0.3)
    x = np.arange(len(labels))
    ax.bar(x, means, yerr=errs, color=colours, capsize=4)
    ax.set_xticks(x, labels, rotation=20, ha="right", fontsize="small")
    return _save(fig, ax, path)


GOLD, PROXY = "eval/gold", ACC
"""Held-out gold reward and the learned (proxy) reward of the same greedy completions (docs/reward-models.md)."""


def gold_proxy_curve(runs) -> Optional[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(kl/init, gold, proxy) [S] at the S evaluation steps every run logged all three at, each the mean over the
    runs (seeds); None when there is no such step."""
    keys = ("kl/init", GOLD, PROXY)
    series = [[dict(zip(*r.series(k))) for k in keys] for r in runs]
    steps = sorted(set.intersection(*(set(d) for per_run in series for d in per_run))) if series else []
    if not steps:
        return None
    return tuple(np.array([np.mean([per_run[i][s] for per_run in series]) for s in steps]) for i in range(3))


LINTHRESH = 0.01
"""Where the gold-vs-drift plot's symlog axis turns linear: below the drift of the first evaluations."""


def plot_gold_vs_kl(path: Path, algo: str, groups: list[Group]) -> Optional[Path]:
    """Gao et al. 2022's view of over-optimisation ("Scaling Laws for Reward Model Overoptimization", fig. 1): the
    gold reward (solid, left axis) and the optimised proxy (dashed, right axis) of the held-out greedy completions
    against the drift from the start (``kl/init``), one curve per group through its evaluations (seed means). Gold
    falling while the proxy still climbs is over-optimisation. The drift axis is logarithmic above ``LINTHRESH``
    and linear below it (symlog, so step 0's kl/init of 0 is drawn): the rise before the fall happens at drifts a
    hundred times smaller than where a run ends."""
    st = styles(groups)
    fig, ax = _figure(f"{algo.upper()}: gold (solid) and proxy (dashed) reward vs drift from init (seed means)",
                      f"kl/init (log scale; linear below {LINTHRESH:g})", f"{GOLD} (gold)")
    ax.set_xscale("symlog", linthresh=LINTHRESH)
    fig.subplots_adjust(right=0.88)  # room for the proxy's axis
    proxy_ax = ax.twinx()
    proxy_ax.set_ylabel(f"{PROXY} (proxy: the optimised reward)")
    drawn = False
    for g in groups:
        curve = gold_proxy_curve(g.completed)
        if curve is None:
            continue
        kl, gold, proxy = curve
        colour, _ = st[g.label]
        ax.plot(kl, gold, color=colour, linestyle="-", marker="o", markersize=3,
                label=f"{g.label} (n={len(g.completed)})")
        proxy_ax.plot(kl, proxy, color=colour, linestyle="--", marker="x", markersize=3)
        drawn = True
    if not drawn:
        return None
    # below the axes: "best" inside them weighs the gold axis's lines only and lands on the proxy's
    handles, labels = ax.get_legend_handles_labels()
    rows = -(-len(labels) // 3)
    fig.set_size_inches(7.5, 4.5 + 0.22 * rows)
    fig.subplots_adjust(bottom=(0.11 * 4.5 + 0.22 * rows + 0.25) / (4.5 + 0.22 * rows),
                        top=1 - 0.08 * 4.5 / (4.5 + 0.22 * rows))
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize="x-small", frameon=False)
    fig.savefig(path, format="png")
    return path


def make_plots(algo: str, groups: list[Group], out_dir: Path) -> dict[str, Path]:
    """Every plot the algorithm has data for: name -> PNG path (missing data = no file)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    logged = {k for g in groups for r in g.completed for k in r.metric_names()}
    reward_key = next((k for k in REWARD_KEYS if k in logged), None)
    # task=preference has no task accuracy: its held-out pair accuracy takes the accuracy plots' place
    acc_key = PREF_ACC if PREF_ACC in logged and ACC not in logged else ACC
    acc_label = "held-out preference accuracy" if acc_key == PREF_ACC else "held-out accuracy"
    made = {
        "reward": reward_key and plot_vs_step(out_dir / f"{algo}_reward.png", algo, groups, reward_key,
                                              reward_key),
        "accuracy": plot_vs_step(out_dir / f"{algo}_accuracy.png", algo, groups, acc_key, acc_label),
        "frontier": plot_frontier(out_dir / f"{algo}_frontier.png", algo, groups, acc_key),
        "kl_ref": plot_vs_step(out_dir / f"{algo}_kl_ref.png", algo, groups, "kl/ref", "kl/ref",
                               seed_lines=True),
        "ref_cost": plot_ref_cost(out_dir / f"{algo}_ref_cost.png", algo, groups),
        "gold": GOLD in logged and plot_gold_vs_kl(out_dir / f"{algo}_gold_vs_kl.png", algo, groups),
    }
    return {k: p for k, p in made.items() if p}

