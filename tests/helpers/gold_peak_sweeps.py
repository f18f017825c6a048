"""Synthetic learned-reward sweeps for the gold-peak tests: GRPO runs whose held-out gold, test and validation, is
known per prompt at every evaluation, so the step validation chooses and the change read on test are known by hand.

Every run evaluates at steps 0, 10, .., 40 on ``TEST`` test and ``VAL`` validation prompts. At each step a curve
gives how many prompts are solved: the seed's easiest ones, in an order drawn per seed (so the prompts are shared and
the pairing by prompt is real). The validation curve of the whole split and that of its first ``BUDGET`` prompts
can peak at different steps, so the chooser's reading is visible."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import yaml

from refexp.record import layout
from refexp.record.metrics import MetricsWriter
from refexp.record.outcomes import EvalOutcomes, append_outcomes
from refexp.record.resolved_config import write_resolved_config
from refexp.record.status import write_status

STEPS, EVERY = 40, 10
TEST, VAL, BUDGET = 200, 100, 20


def _solved(order: np.ndarray, n: int, size: int) -> list[float]:
    """Scores [size] solving the ``n`` prompts first in ``order``."""
    scores = np.zeros(size)
    scores[order[:n]] = 1.0
    return scores.tolist()


def write_run(root: Path, arm: str, beta: float, seed: int, *, test: list[float], val: list[float],
              val_budget: Optional[list[float]] = None, decl: dict) -> Path:
    """A completed run of ``arm`` at ``beta`` whose gold at step 10 k is ``test[k]`` on the test prompts and
    ``val[k]`` on the validation split; ``val_budget[k]``: the share solved of the first ``BUDGET`` validation
    prompts (default: as the whole split). Shares are rounded to whole prompts; kl/init is step / 100."""
    run_dir = root / f"{arm}-{beta:g}-{seed}"
    (run_dir / layout.HYDRA_DIR).mkdir(parents=True)
    overrides = [f"grpo_variant={arm}", f"algo.beta={beta:g}", f"training.seed={seed}"]
    (run_dir / layout.HYDRA_DIR / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    write_resolved_config(run_dir, {
        "algo": {"name": "grpo", "beta": beta}, "reference": {"name": "fixed" if arm == "fixed" else "none"},
        "eval": {"num_prompts": TEST}, "training": {"seed": seed, "steps": STEPS, "num_threads": 2},
        "sft": {"seed": 0}, "comparison": decl})
    rng = np.random.default_rng(100 + seed)
    test_order, head, tail = rng.permutation(TEST), rng.permutation(BUDGET), BUDGET + rng.permutation(VAL - BUDGET)
    log = MetricsWriter(run_dir)
    final = {}
    for k, step in enumerate(range(0, STEPS + 1, EVERY)):
        n_val = round(val[k] * VAL)
        n_head = round((val_budget or val)[k] * BUDGET)
        val_scores = np.zeros(VAL)
        val_scores[head[:n_head]] = 1.0
        val_scores[tail[:max(n_val - n_head, 0)]] = 1.0
        gold = _solved(test_order, round(test[k] * TEST), TEST)
        append_outcomes(run_dir, step, [EvalOutcomes("eval", "eval/gold", list(range(TEST)), gold),
                                        EvalOutcomes("val", "val/gold", list(range(VAL)), val_scores.tolist())])
        final = {"kl/init": step / 100, "eval/gold": float(np.mean(gold)), "val/gold": float(val_scores.mean()),
                 "eval/accuracy": 0.5 + step / 100}
        log.write({"step": step, **final, "reward/mean": final["eval/accuracy"]})
    log.close()
    write_status(run_dir, {"status": "completed", "algo": "grpo", "seed": seed, "steps": STEPS, "last_step": STEPS,
                           "final": final, "provenances": [{"commit": "abc"}]})
    return run_dir
