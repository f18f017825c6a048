"""Gao et al.'s functional form for RL fitted per reference strategy: the change of the held-out gold reward against
the drift from the start.

Gao, Schulman and Hilton 2022 ("Scaling Laws for Reward Model Overoptimization", eq. 2, the RL form) find the gold
reward of a policy optimised against a proxy follows R(d) = d (alpha_rl - beta_rl log d) in
d = sqrt(KL(policy || init)), a curve through 0 at d = 0: the paper's alpha and beta, named ``alpha_rl``, ``beta_rl``
and printed α_RL, β_RL, so that none reads them as the KL coefficient ``algo.beta`` of the same report. In refexp
the gold at step 0 is the start's gold, not 0, so the fitted quantity is each run's *change* from its own step-0
evaluation:

    Δgold(d) = gold(d) - gold(0) = alpha_rl d - beta_rl d log d,    d = sqrt(kl/init)

which is linear in (alpha_rl, beta_rl): least squares on the pooled points. Where beta_rl > 0 the curve peaks at
d* = exp(alpha_rl / beta_rl - 1) with height R* = beta_rl d* (dR/dd = alpha_rl - beta_rl log d - beta_rl = 0);
beta_rl <= 0 has no peak (the fitted gold never turns down), written d* = R* = inf. ``kl/init`` is refexp's mean
per-token KL on held-out prompts (docs/metrics.md), not the paper's per-sequence KL, so alpha_rl and beta_rl are in
its units.

One fit per reference strategy: with a declared frontier (``comparison.frontier_key``, e.g. ``algo.beta``) an arm's
runs across the key form one curve (``frontier.curve_label``); otherwise each report group is one. Every evaluation
after step 0 of every counted completed run of it is a point. The intervals are percentile intervals of a bootstrap
that resamples the replicates the rest of the report resamples: SFT starts, then seeds within start (``Unit``), each
drawn replicate bringing all its runs' points; the prompts are not resampled (the fit reads each evaluation's mean).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from refexp.record.metric_names import EVAL_GOLD, KL_INIT
from refexp.report.reading.comparison_plan import ComparisonPlan
from refexp.report.reading.group import group_runs
from refexp.report.reading.load import Run, natural_key
from refexp.report.statistics.frontier import common_settings, curve_label, planned_runs
from refexp.report.statistics.paired import START_LEVEL, Unit

N_BOOT = 2000
"""Bootstrap replicates per fit (seeded: a report is reproducible); each is two 2x2 sums and a solve."""
MIN_REPLICATES = 2
"""Fewer (SFT start, seed) replicates leave nothing for the bootstrap to resample."""
MIN_DISTINCT_D = 3
"""Distinct d > 0 a fit needs: two parameters and one point to spare (two distinct d fit any two points exactly)."""
PARAMETERS = ("alpha_rl", "beta_rl", "d_star", "r_star")


def run_points(run: Run) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """(d [S], Δgold [S]) at the run's S evaluations after step 0 that logged both ``kl/init`` and ``eval/gold``:
    d = sqrt(kl/init), Δgold = eval/gold - its step-0 value. None without a step-0 ``eval/gold`` (nothing to measure
    the change from); a negative kl/init (an estimator's noise) counts as 0."""
    gold = dict(zip(*run.series(EVAL_GOLD)))
    kl = dict(zip(*run.series(KL_INIT)))
    if 0.0 not in gold:
        return None
    steps = sorted(s for s in gold if s in kl and s > 0)
    d = np.sqrt(np.maximum([kl[s] for s in steps], 0.0))
    return d, np.array([gold[s] - gold[0.0] for s in steps])


def design(d: np.ndarray) -> np.ndarray:
    """The regressors [N, 2] of Δgold = alpha_rl d - beta_rl d log d at d [N]: (d, -d log d), whose limit at d = 0
    is 0."""
    d = np.asarray(d, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        dlogd = np.where(d > 0, d * np.log(np.where(d > 0, d, 1.0)), 0.0)
    return np.column_stack([d, -dlogd])


def curve(alpha_rl: float, beta_rl: float, d: np.ndarray) -> np.ndarray:
    """The fitted Δgold [N] at d [N]."""
    return design(d) @ np.array([alpha_rl, beta_rl])


def peak(alpha_rl, beta_rl):
    """(d*, R*) of the form (arrays of any one shape, or floats): d* = exp(alpha_rl/beta_rl - 1), R* = beta_rl d*
    where beta_rl > 0, else (inf, inf): no peak. A d* too large for a float is inf as well."""
    alpha_rl, beta_rl = np.asarray(alpha_rl, dtype=float), np.asarray(beta_rl, dtype=float)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        peaks = beta_rl > 0
        d_star = np.where(peaks, np.exp(np.where(peaks, alpha_rl / np.where(peaks, beta_rl, 1.0) - 1, 0.0)), np.inf)
        r_star = np.where(peaks, beta_rl * d_star, np.inf)
    if d_star.ndim == 0:
        return float(d_star), float(r_star)
    return d_star, r_star


def percentile(values: np.ndarray, ci_alpha: float) -> tuple[float, float]:
    """The (ci_alpha/2, 1 - ci_alpha/2) percentile interval of ``values`` [B] as order statistics (``inverted_cdf``), so
    that replicates without a peak (inf) bound an interval without arithmetic on infinity; NaN replicates dropped."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    lo, hi = np.quantile(v, [ci_alpha / 2, 1 - ci_alpha / 2], method="inverted_cdf")
    return float(lo), float(hi)


@dataclass
class GaoFit:
    """One reference strategy's fit: the form's parameters, their intervals, and the points it read."""

    label: str
    runs: int
    replicates: int
    points: int
    """Evaluations after step 0, pooled over the runs."""
    no_fit: str = ""
    """Why there is no fit (one phrase); "": fitted."""
    alpha_rl: float = math.nan
    beta_rl: float = math.nan
    d_star: float = math.nan
    """Where the fitted Δgold peaks (inf: beta_rl <= 0, no peak)."""
    r_star: float = math.nan
    """The fitted Δgold at d* (inf: no peak)."""
    r2: float = math.nan
    """1 - SS_res / SS_tot about the mean of the pooled Δgold (a form without intercept can score below 0)."""
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)
    """parameter (``PARAMETERS``) -> its percentile interval (an end may be inf for d*, R*)."""
    no_peak_share: float = 0.0
    """Share of the bootstrap replicates without a peak (beta_rl <= 0)."""
    d_max: float = math.nan
    """The largest d observed: a d* beyond it is extrapolated."""
    d: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    """The pooled points' d [N] and Δgold [N] (for the plot)."""
    dgold: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    levels: tuple[str, ...] = ("seed",)
    """What the bootstrap resamples, outermost first."""
    n_boot: int = 0


def fit(label: str, by_unit: dict[Unit, list[tuple[np.ndarray, np.ndarray]]], *, n_boot: int = N_BOOT,
        seed: int = 0, ci_alpha: float = 0.05) -> GaoFit:
    """Fit Δgold = alpha_rl d - beta_rl d log d to every run's points of ``by_unit`` ((SFT start, seed) -> its runs'
    (d [S], Δgold [S])), with (1 - ``ci_alpha``) percentile intervals from ``n_boot`` replicates that draw SFT starts
    with replacement, then each drawn start's seeds with replacement (a start with one seed, or one start, resamples
    what varies). No fit, and why, with fewer than ``MIN_REPLICATES`` replicates or ``MIN_DISTINCT_D`` distinct d."""
    units = sorted(by_unit, key=lambda u: (natural_key(u[0]), u[1] if u[1] is not None else -1))
    d = np.concatenate([p[0] for u in units for p in by_unit[u]] or [np.zeros(0)])
    y = np.concatenate([p[1] for u in units for p in by_unit[u]] or [np.zeros(0)])
    out = GaoFit(label, sum(len(by_unit[u]) for u in units), len(units), len(d), d=d, dgold=y)
    if len(units) < MIN_REPLICATES:
        out.no_fit = f"fewer than {MIN_REPLICATES} replicates (SFT start, seed)"
        return out
    if len(np.unique(d[d > 0])) < MIN_DISTINCT_D:
        out.no_fit = f"fewer than {MIN_DISTINCT_D} distinct sqrt(kl/init) > 0"
        return out
    x = design(d)
    theta, *_ = np.linalg.lstsq(x, y, rcond=None)
    out.alpha_rl, out.beta_rl = float(theta[0]), float(theta[1])
    out.d_star, out.r_star = peak(out.alpha_rl, out.beta_rl)
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    out.r2 = 1.0 - float(np.sum((y - x @ [out.alpha_rl, out.beta_rl]) ** 2)) / ss_tot if ss_tot > 0 else math.nan
    out.d_max = float(d.max())

    # Least squares through the normal equations: per replicate, sum(count_u * X_u'X_u) theta = sum(count_u * X_u'y_u)
    xs = [design(_cat(by_unit[u], 0)) for u in units]                                             # each [N_u, 2]
    xtx = np.stack([x_u.T @ x_u for x_u in xs])                                                    # [U, 2, 2]
    xty = np.stack([x_u.T @ _cat(by_unit[u], 1) for x_u, u in zip(xs, units)])                     # [U, 2]
    counts = _draw_counts(units, n_boot, np.random.default_rng(seed))                               # [B, U]
    a, b = np.einsum("bu,uij->bij", counts, xtx), np.einsum("bu,ui->bi", counts, xty)
    det = a[:, 0, 0] * a[:, 1, 1] - a[:, 0, 1] * a[:, 1, 0]
    ok = np.abs(det) > 1e-12 * np.maximum(a[:, 0, 0] * a[:, 1, 1], 1e-300)  # a replicate of one d: no solution
    theta = np.full((n_boot, 2), np.nan)
    theta[ok] = np.linalg.solve(a[ok], b[ok][..., None])[..., 0]
    d_star, r_star = peak(theta[:, 0], theta[:, 1])
    d_star[~ok], r_star[~ok] = np.nan, np.nan
    reps = {"alpha_rl": theta[:, 0], "beta_rl": theta[:, 1], "d_star": d_star, "r_star": r_star}
    out.intervals = {k: percentile(v, ci_alpha) for k, v in reps.items()}
    out.no_peak_share = float(np.mean(np.isinf(d_star[ok]))) if ok.any() else math.nan
    out.levels = (START_LEVEL, "seed") if len({u[0] for u in units}) > 1 else ("seed",)
    out.n_boot = n_boot
    return out


def _cat(points: list[tuple[np.ndarray, np.ndarray]], i: int) -> np.ndarray:
    return np.concatenate([p[i] for p in points])


def _draw_counts(units: list[Unit], n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """How often each unit is drawn [B, U]: starts with replacement (a multinomial over the S starts), then for each
    start drawn m times, m x (its seeds) draws of its seeds with replacement (a multinomial over them)."""
    starts = sorted({u[0] for u in units}, key=natural_key)
    start_counts = rng.multinomial(len(starts), [1 / len(starts)] * len(starts), size=n_boot)   # [B, S]
    counts = np.zeros((n_boot, len(units)))
    for j, s in enumerate(starts):
        cols = [i for i, u in enumerate(units) if u[0] == s]
        counts[:, cols] = rng.multinomial(start_counts[:, j] * len(cols), [1 / len(cols)] * len(cols))
    return counts


def strategy_runs(runs: list[Run], plan: ComparisonPlan) -> dict[str, list[Run]]:
    """label -> the counted completed runs of one reference strategy: an arm's curve across the declared
    ``frontier_key`` (``frontier.curve_label``), else a report group (its label, the algorithm's before it when the
    sweep has several)."""
    if plan.block and plan.block.get("frontier_key"):
        planned = planned_runs(runs, plan)
        common = common_settings(planned)
        out: dict[str, list[Run]] = {}
        for r in planned:
            out.setdefault(curve_label(r, plan, common), []).append(r)
        arms = list(plan.block["arms"])  # in the block's order of arms, as the frontier's tables
        return dict(sorted(out.items(), key=lambda kv: (arms.index(plan.arm(kv[1][0])), kv[0])))
    by_algo = group_runs(runs)
    return {(f"{algo} " if len(by_algo) > 1 else "") + g.label: [r for r in g.completed if plan.counts(r)]
            for algo, groups in by_algo.items() for g in groups}


def logs_gold(run: Run) -> bool:
    """Whether the run logged both ``eval/gold`` and ``kl/init``."""
    return {EVAL_GOLD, KL_INIT} <= run.metric_names()


def fits(runs: list[Run], plan: ComparisonPlan, *, n_boot: int = N_BOOT) -> list[GaoFit]:
    """One fit per reference strategy whose runs logged ``eval/gold`` and ``kl/init`` (``strategy_runs``); [] when
    no counted completed run did. A run without a step-0 ``eval/gold`` brings no point."""
    out = []
    for label, members in strategy_runs(runs, plan).items():
        members = [r for r in members if logs_gold(r)]
        if not members:
            continue
        by_unit: dict[Unit, list] = {}
        for r in members:
            if (p := run_points(r)) is not None:
                by_unit.setdefault((r.sft_start, r.seed), []).append(p)
        got = fit(label, by_unit, n_boot=n_boot, ci_alpha=plan.alpha)
        if not by_unit:
            got.no_fit = "no run has a step-0 eval/gold to measure the change from"
        out.append(got)
    return out
