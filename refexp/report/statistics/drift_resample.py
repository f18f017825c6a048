"""The matched-drift bootstrap with the drift measurement resampled too.

A run's final ``kl/init`` (the frontier's x) is itself an estimate over ``eval.kl_prompts`` sampled prompts, so the
x at which each curve is read is uncertain. Runs that logged each prompt's linearised contribution to it
(``eval_outcomes.jsonl``, refexp/components/evaluation.py ``kl_influence``) have their x resampled here, prompt by
prompt, once per bootstrap replicate: each replicate re-reads every replicate's (SFT start, seed) curves at the
matched x with the resampled x-values (piecewise-linear in log x, flat beyond the outermost runs) and adds the shift
of the hierarchical mean difference it causes to the accuracy bootstrap's replicate (``frontier.py``). The two draws
are independent: the KL's prompts (the first ``eval.kl_prompts`` test prompts) overlap the accuracy's, and that
correlation is left out; the shift is read from the run-level accuracies with the (start, seed) units held fixed,
which the accuracy bootstrap already resamples. Runs without per-prompt drift (written before it was logged) leave
the bootstrap as it was, and the report says which it did.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from refexp.report.reading.load import natural_key
from refexp.report.statistics.bootstrap import BootstrapResult
from refexp.report.statistics.metric_scores import final_scores

SEED = 1
"""The generator's seed (a report is reproducible; another stream than the accuracy bootstrap's seed 0)."""
FLOOR = 1e-12
"""A resampled drift at or below 0 (possible: a linearised contribution can be negative) is read at this, on a log
axis."""


def drift_draws(pts: Sequence, key: str, n_boot: int, rng: np.random.Generator) -> Optional[np.ndarray]:
    """[n_boot, len(pts)] resampled final x of each point's run (the mean of its per-prompt contributions to
    ``key`` drawn with replacement); None when some run did not log them."""
    out = np.empty((n_boot, len(pts)))
    for k, p in enumerate(pts):
        scores = final_scores(p.run, key)
        if scores is None:
            return None
        s = np.fromiter(scores.values(), dtype=float)
        out[:, k] = s[rng.integers(0, len(s), size=(n_boot, len(s)))].mean(axis=1)
    return out


def read_at(xs: np.ndarray, ys: np.ndarray, x: float, log: bool) -> np.ndarray:
    """The piecewise-linear curve through (xs[b], ys) at ``x``, per row b: ``xs`` [B, k] (any order), ``ys`` [k];
    flat beyond the outermost points. Returns [B]."""
    t = np.log(np.maximum(xs, FLOOR)) if log else xs
    tx = np.log(x) if log else x
    order = np.argsort(t, axis=1)
    t = np.take_along_axis(t, order, axis=1)
    y = np.asarray(ys, dtype=float)[order]
    j = np.clip((t <= tx).sum(axis=1) - 1, 0, t.shape[1] - 2)
    rows = np.arange(len(t))
    t0, t1, y0, y1 = t[rows, j], t[rows, j + 1], y[rows, j], y[rows, j + 1]
    share = np.clip(np.divide(tx - t0, t1 - t0, out=np.zeros_like(t0), where=t1 > t0), 0.0, 1.0)
    return y0 + share * (y1 - y0)


def drift_shift(arm: dict, base: dict, units: list, x: float, log: bool, key: str, n_boot: int
                ) -> Optional[np.ndarray]:
    """[n_boot] the shift of the hierarchical mean (over starts, of the mean over their seeds) of arm - baseline at
    ``x`` when every run's x is resampled (``arm``, ``base``: unit -> the curve's points sorted by x); None when a
    run lacks per-prompt drift."""
    rng = np.random.default_rng(SEED)
    by_start: dict[str, list[np.ndarray]] = {}
    for u in units:
        diff = np.zeros(n_boot)
        for sign, pts in ((1.0, arm[u]), (-1.0, base[u])):
            xs = drift_draws(pts, key, n_boot, rng)
            if xs is None:
                return None
            ys = [p.y for p in pts]
            observed = read_at(np.array([[p.x for p in pts]]), ys, x, log)[0]
            diff += sign * (read_at(xs, ys, x, log) - observed)
        by_start.setdefault(u[0], []).append(diff)
    per_start = [np.mean(v, axis=0) for _, v in sorted(by_start.items(), key=lambda kv: natural_key(kv[0]))]
    return np.mean(per_start, axis=0)


def shifted(boot: BootstrapResult, shift: np.ndarray) -> BootstrapResult:
    """The bootstrap with each replicate moved by the drift resample's shift [B] (same point, levels and units)."""
    return BootstrapResult.from_replicates(boot.replicates + shift, boot.point, alpha=boot.alpha, levels=boot.levels,
                                           n_units=boot.n_units, resampled=boot.resampled,
                                           shared_prompts=boot.shared_prompts)
