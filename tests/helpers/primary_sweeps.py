"""Synthetic GRPO sweeps for the primary-contrast and power-plan tests: completed runs written with the run record's
writers, each scoring a given 0/1 vector on the held-out prompts at its final evaluation (0 at step 0)."""

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

STEPS, PROMPTS = 10, 200


def block(arms, *, primary=(), seeds=(0, 1), **more) -> dict:
    """A declared comparison over ``arms`` (``grpo_variant``, baseline fixed) with these primary contrasts."""
    return {"arm_key": "grpo_variant", "arms": list(arms), "baseline": "fixed", "seeds": list(seeds),
            "metric": "eval/accuracy", "at_steps": [], "chosen_on_test": [], "primary": list(primary), **more}


def write_run(run_dir: Path, arm: str, seed: int, final: np.ndarray, *, decl: Optional[dict],
              beta: Optional[float] = None, sft_seed: Optional[int] = None,
              retention: Optional[np.ndarray] = None, gold: Optional[np.ndarray] = None) -> Path:
    """A completed run of ``arm`` (its ``grpo_variant`` and reference strategy; ``sft.seed`` and ``algo.beta``
    swept too when given) whose final evaluation scored ``final`` [PROMPTS]; with ``retention`` [PROMPTS], its final
    ``eval/retention`` scores (every retained prompt right at step 0); with ``gold`` [PROMPTS], a learned-reward run's
    final ``eval/gold`` scores of the same prompts (``final`` is then the proxy; gold 0.5 everywhere at step 0)."""
    overrides = [f"grpo_variant={arm}", f"training.seed={seed}"]
    overrides += [f"algo.beta={beta:g}"] if beta is not None else []
    overrides += [f"sft.seed={sft_seed}"] if sft_seed is not None else []
    (run_dir / layout.HYDRA_DIR).mkdir(parents=True)
    (run_dir / layout.HYDRA_DIR / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    write_resolved_config(run_dir, {
        "algo": {"name": "grpo", "beta": beta if beta is not None else 1.0}, "reference": {"name": arm},
        "eval": {"num_prompts": PROMPTS}, "training": {"seed": seed, "steps": STEPS, "num_threads": 2},
        "sft": {"seed": sft_seed or 0},
        "comparison": decl or {"arm_key": "", "arms": [], "baseline": "", "seeds": []}})
    log = MetricsWriter(run_dir)
    ids = list(range(PROMPTS))
    for step, scores, kept, true in ((0, np.zeros(PROMPTS), np.ones(PROMPTS), np.full(PROMPTS, 0.5)),
                                     (STEPS, final, retention, gold)):
        row = {"step": step, "eval/accuracy": float(scores.mean()), "reward/mean": 0.5}
        measured = [EvalOutcomes("eval", "eval/accuracy", ids, scores.tolist())]
        if retention is not None:
            row["eval/retention"] = float(kept.mean())
            measured.append(EvalOutcomes("retain_eval", "eval/retention", ids, kept.tolist()))
        if gold is not None:
            row["eval/gold"] = float(true.mean())
            measured.append(EvalOutcomes("eval", "eval/gold", ids, true.tolist()))
        log.write(row)
        append_outcomes(run_dir, step, measured)
    log.close()
    status = {"status": "completed", "algo": "grpo", "reference": arm, "seed": seed, "steps": STEPS,
              "last_step": STEPS, "final": {"eval/accuracy": float(final.mean())}, "provenances": [{"commit": "abc"}]}
    write_status(run_dir, status)
    return run_dir


def flipped(base: np.ndarray, up: int, down: int, rng: np.random.Generator) -> np.ndarray:
    """``base`` [P] 0/1 scores with ``up`` wrong prompts made right and ``down`` right ones made wrong."""
    out = base.copy()
    out[rng.choice(np.flatnonzero(base == 0), up, replace=False)] = 1.0
    out[rng.choice(np.flatnonzero(base == 1), down, replace=False)] = 0.0
    return out
