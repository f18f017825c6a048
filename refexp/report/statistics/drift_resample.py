"""The matched-drift bootstrap with the drift measurement resampled too.

A run's final ``kl/init`` (the frontier's x) is itself an estimate over ``eval.kl_prompts`` sampled prompts, so the
x at which each curve is read is uncertain. Runs that logged each prompt's linearised contribution to it
(``eval_outcomes.jsonl``, refexp/components/evaluation.py ``kl_influence``) have their x resampled here, prompt by
prompt, once per bootstrap replicate: each replicate re-reads every replicate's (SFT start, seed) curves at the
matched x with the resampled x-values (piecewise-linear in log x, flat beyond the outermost runs) and adds the shift
of the hierarchical mean difference it causes to the accuracy bootstrap's replicate (``frontier.py``).

Every run measures its drift on the same prompts (the first ``eval.kl_prompts`` test prompts), and two runs'
contributions on a prompt correlate (a prompt that draws one policy far from its start draws the others too), so a
replicate draws the prompt ids once, with replacement, and every run of the contrast (both arms, every start and
seed) is read on that one draw: the prompts are crossed with the runs, as in the accuracy bootstrap. Drawing each run's
prompts afresh would treat that common prompt effect as independent between the runs, which need not cancel in a
difference of interpolated curves and overstated the x-noise. The draw is over the prompt ids every run of the
contrast logged; a run that logged more keeps its own x, moved by how far the draw's mean of its contributions lies
from their mean over those shared ids (so leaving prompts out of the draw moves no run). The kl prompt draw is
independent of the accuracy bootstrap's prompt draw (another stream: crossed with it, not matched to it, although
the two prompt sets overlap); the shift is read from the run-level accuracies with the (start, seed) units held
fixed, which the accuracy bootstrap already resamples. The two being independent, the replicate's variance is the sum
of theirs, and ``x_noise_share`` is the part due to the drift: Var(shift) / (Var(accuracy) + Var(shift)). Runs
without per-prompt drift (written before it was logged), or sharing no prompt id, leave the bootstrap as it was,
and the report says which it did.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

from refexp.report.reading.load import natural_key
from refexp.report.statistics.bootstrap import BootstrapResult
from refexp.report.statistics.metric_scores import aligned, final_scores

SEED = 1
"""The generator's seed (a report is reproducible; another stream than the accuracy bootstrap's seed 0)."""
FLOOR = 1e-12
"""A resampled drift at or below 0 (possible: a linearised contribution can be negative) is read at this, on a log
axis."""


def prompt_draws(n_prompts: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """[n_boot, n_prompts] how often each prompt is drawn in each replicate's ``n_prompts`` draws with replacement
    (the counts of one index draw per replicate)."""
    return rng.multinomial(n_prompts, np.full(n_prompts, 1.0 / n_prompts), size=n_boot)


def drift_draws(pts: Sequence, key: str, n_boot: int, rng: np.random.Generator) -> Optional[np.ndarray]:
    """[n_boot, len(pts)] resampled final x of each point's run, every run read on ONE draw of prompt ids per
    replicate (over the ids every one of ``pts`` logged): its x plus the draw's mean of its per-prompt contributions
    to ``key`` minus their mean over those ids. None when some run did not log them or they share no prompt id."""
    got = aligned([final_scores(p.run, key) for p in pts])
    if got is None:
        return None
    ids, scores = got
    contributions = np.stack(scores)  # [R, P], R = len(pts), over the shared ids
    counts = prompt_draws(len(ids), n_boot, rng)  # [B, P]
    drawn = counts @ contributions.T / len(ids)  # [B, R]
    return np.array([p.x for p in pts]) + drawn - contributions.mean(axis=1)


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
    ``x`` when every run's x is resampled, all of them on one prompt draw per replicate (``drift_draws``; ``arm``,
    ``base``: unit -> the curve's points sorted by x); None when a run lacks per-prompt drift or the runs share no
    prompt id."""
    curves = [c[u] for u in units for c in (arm, base)]  # each unit's arm curve, then its baseline's
    xs = drift_draws([p for pts in curves for p in pts], key, n_boot, np.random.default_rng(SEED))
    if xs is None:
        return None
    edges = np.cumsum([0] + [len(pts) for pts in curves])
    moved = [_moved(pts, xs[:, lo:hi], x, log) for pts, lo, hi in zip(curves, edges, edges[1:])]
    by_start: dict[str, list[np.ndarray]] = {}
    for k, u in enumerate(units):
        by_start.setdefault(u[0], []).append(moved[2 * k] - moved[2 * k + 1])
    per_start = [np.mean(v, axis=0) for _, v in sorted(by_start.items(), key=lambda kv: natural_key(kv[0]))]
    return np.mean(per_start, axis=0)


def _moved(pts: Sequence, xs: np.ndarray, x: float, log: bool) -> np.ndarray:
    """[B] how far the curve through ``pts`` moves at ``x`` when its points' x are ``xs`` [B, len(pts)]."""
    ys = [p.y for p in pts]
    return read_at(xs, ys, x, log) - read_at(np.array([[p.x for p in pts]]), ys, x, log)[0]


def x_noise_share(replicates: np.ndarray, shift: np.ndarray) -> float:
    """Var(shift) / (Var(replicates) + Var(shift)), in [0, 1]: the share of a shifted bootstrap's variance due to
    the drift's own prompt noise (``replicates`` [B]: the accuracy bootstrap's, ``shift`` [B]: ``drift_shift``'s, an
    independent draw, so their variances add); 0 when neither varies."""
    v_shift, v_acc = float(np.var(shift)), float(np.var(replicates))
    return v_shift / (v_acc + v_shift) if v_acc + v_shift > 0 else 0.0


def shifted(boot: BootstrapResult, shift: np.ndarray) -> BootstrapResult:
    """The bootstrap with each replicate moved by the drift resample's shift [B] (same point, levels and units),
    recording the share of its variance the shift brings (``x_noise_share``)."""
    moved = BootstrapResult.from_replicates(boot.replicates + shift, boot.point, alpha=boot.alpha, levels=boot.levels,
                                            n_units=boot.n_units, resampled=boot.resampled,
                                            shared_prompts=boot.shared_prompts)
    return dataclasses.replace(moved, x_noise_share=x_noise_share(boot.replicates, shift))


def x_noise_sentence(shares: Sequence[tuple[str, float]], key: str) -> list[str]:
    """The sentence a matched table prints of its comparisons' x-noise shares (``shares``: (label, share) of each
    comparison whose x was resampled); none without one."""
    if not shares:
        return []
    return [f"Share of each bootstrap's variance due to the {key} measurement's own prompt noise (x-noise: one draw "
            f"of the {key} prompts per replicate for every run, crossed with the accuracy prompts): "
            + "; ".join(f"{label}: {share:.2f}" for label, share in shares) + "."]
