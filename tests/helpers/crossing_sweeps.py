"""Synthetic sweeps for the crossing estimand (``comparison.matched.estimand: crossing``): GRPO runs that log their
drift (``kl/init``) and test accuracy at every evaluation, steps 0, 10, .., 40, with per-prompt outcomes at each
(the seed's easiest prompts solved, as in ``frontier_sweeps``), so a run's crossing of a drift is known by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import yaml

from refexp.record import layout
from refexp.record.metrics import MetricsWriter
from refexp.record.outcomes import EvalOutcomes, append_outcomes
from refexp.record.resolved_config import write_resolved_config
from refexp.record.status import write_status
from tests.helpers.frontier_sweeps import PROMPTS, ranking

STEPS, EVERY = 40, 10
EVAL_STEPS = tuple(range(EVERY, STEPS + 1, EVERY))
"""The evaluations after step 0 (the ones a crossing is read between)."""


def write_run(root: Path, arm: str, beta: float, seed: int, *, drift: Sequence[float], decl: dict,
              solved: Optional[Sequence[int]] = None, accuracy: Optional[Sequence[float]] = None) -> Path:
    """A completed run of ``arm`` at ``beta`` whose ``kl/init`` at ``EVAL_STEPS`` is ``drift`` (0 at step 0) and whose
    test evaluation there solves the ``solved`` easiest prompts of its seed (per-prompt outcomes written; none at step
    0), or logs ``accuracy`` without per-prompt outcomes (any float: what a simulated run's metric is)."""
    run_dir = root / f"{arm}-{beta:g}-{seed}"
    (run_dir / layout.HYDRA_DIR).mkdir(parents=True)
    (run_dir / layout.HYDRA_DIR / "overrides.yaml").write_text(
        yaml.safe_dump([f"grpo_variant={arm}", f"algo.beta={beta:g}", f"training.seed={seed}"]))
    write_resolved_config(run_dir, {
        "algo": {"name": "grpo", "beta": beta}, "reference": {"name": "fixed" if arm == "fixed" else "ema"},
        "eval": {"num_prompts": PROMPTS, "every": EVERY}, "training": {"seed": seed, "steps": STEPS, "num_threads": 2},
        "comparison": decl})
    log = MetricsWriter(run_dir)
    log.write({"step": 0, "kl/init": 0.0, "eval/accuracy": 0.0})
    row = {}
    for k, step in enumerate(EVAL_STEPS):
        if solved is not None:
            scores = np.zeros(PROMPTS)
            scores[ranking(seed)[:solved[k]]] = 1.0
            append_outcomes(run_dir, step, [EvalOutcomes("eval", "eval/accuracy", list(range(PROMPTS)),
                                                         scores.tolist())])
            value = float(scores.mean())
        else:
            value = float(accuracy[k])
        row = {"kl/init": float(drift[k]), "eval/accuracy": value}
        log.write({"step": step, **row})
    log.close()
    write_status(run_dir, {"status": "completed", "algo": "grpo", "seed": seed, "steps": STEPS, "last_step": STEPS,
                           "final": row, "provenances": [{"commit": "abc"}]})
    return run_dir


def crossing_block(at: Sequence[float], *, estimand: str = "crossing", margin: Optional[float] = 0.05) -> dict:
    """A declared comparison of ema against fixed across ``algo.beta`` at kl/init ``at``, read as ``estimand``."""
    return {"arm_key": "grpo_variant", "arms": ["fixed", "ema"], "baseline": "fixed", "seeds": [0, 1, 2],
            "metric": "eval/accuracy", "at_steps": [], "chosen_on_test": [], "frontier_key": "algo.beta",
            "frontier_gap": 20.0, "primary": ["ema"], "equivalence_margin": margin,
            "matched": {"axis": "kl/init", "at": list(at), "estimand": estimand},
            "select": {"metric": "", "maximize": True, "floor": {}}}


FIXED = {0.1: ([0.05, 0.1, 0.4, 0.8], [80, 100, 140, 150]), 1.0: ([0.01, 0.02, 0.03, 0.05], [60, 62, 64, 66])}
"""fixed's runs: beta -> (drift at EVAL_STEPS, prompts solved there; + the seed at beta 0.1)."""
EMA = {0.1: ([0.7, 0.9, 1.2, 1.5], [120, 130, 140, 150]), 1.0: ([0.1, 0.15, 0.25, 0.3], [90, 110, 130, 140])}
"""ema's runs: as ``FIXED`` (+ 3 x the seed at beta 1, step 30); seed 2's beta 0.1 run drifts less:
``EMA_SEED_2``."""
EMA_SEED_2 = [0.3, 0.35, 0.4, 0.45]


def crossing_sweep(root: Path, at: Sequence[float], **block) -> None:
    """fixed and ema at beta 0.1 and 1, seeds 0, 1, 2 (``FIXED``, ``EMA``): at kl/init 0.2 fixed's beta 0.1 run
    passes it halfway in log between steps 20 and 30 (0.1 -> 0.4), its beta 1 run never reaches it; ema's beta 1 run
    passes it between steps 20 and 30 (0.15 -> 0.25), its beta 0.1 run had passed it by step 10."""
    decl = crossing_block(at, **block)
    for seed in (0, 1, 2):
        for beta, (drift, solved) in FIXED.items():
            write_run(root, "fixed", beta, seed, drift=drift, decl=decl,
                      solved=[n + seed * (beta == 0.1) for n in solved])
        for beta, (drift, solved) in EMA.items():
            more = [0, 0, 3 * seed * (beta == 1.0), 0]
            write_run(root, "ema", beta, seed, drift=EMA_SEED_2 if (seed, beta) == (2, 0.1) else drift, decl=decl,
                      solved=[n + m for n, m in zip(solved, more)])
