"""Synthetic frontier sweeps for the report's tests: GRPO runs of several arms across ``algo.beta`` and seeds,
each written with the run record's writers, whose final evaluation scores chosen prompts of a fixed set.

Within a seed the prompts are ranked once (a random permutation): a run that solves k prompts solves the k
first of that ranking, so runs of one seed are nested, as runs from one start tend to be on easy prompts."""

from __future__ import annotations

import math
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
BETAS = (0.01, 0.04, 0.2, 1.0)
LEVEL = {beta: i for i, beta in enumerate(reversed(BETAS))}
"""beta 1.0 -> 0, ..., beta 0.01 -> 3: ``frontier_sweep``'s kl/init is 10^(level - 1) (0.1 .. 100), its accuracy 0.3 +
0.1 per level (+0.01 per seed)."""


def block(arms: list[str], *, select: Optional[dict] = None, seeds=(0, 1, 2), gap: Optional[float] = 5.0) -> dict:
    """A declared comparison over ``arms`` (baseline fixed) with ``algo.beta`` as the frontier key; ``gap`` its
    ``frontier_gap`` (5: ``BETAS``' widest step is bridged; None: the block declares none)."""
    out = {"arm_key": "grpo_variant", "arms": list(arms), "baseline": "fixed", "seeds": list(seeds),
           "metric": "eval/accuracy", "at_steps": [], "chosen_on_test": [], "frontier_key": "algo.beta",
           "select": select or {"metric": "", "maximize": True, "floor": {}}}
    return out if gap is None else {**out, "frontier_gap": gap}


def ranking(seed: int) -> np.ndarray:
    """The seed's order of prompts, easiest first [PROMPTS]."""
    return np.random.default_rng(100 + seed).permutation(PROMPTS)


def write_run(root: Path, arm: str, beta: float, seed: int, *, solved: int, kl: float, decl: dict,
              val: Optional[float] = None, extra: Optional[dict] = None, overrides: tuple = (),
              retained: Optional[tuple[int, int]] = None, start_extra: Optional[dict] = None,
              kl_per_prompt: Optional[list[float]] = None,
              val_outcomes: Optional[dict[str, list[float]]] = None) -> Path:
    """A completed run of ``arm`` at ``beta`` whose final test evaluation solves the ``solved`` easiest prompts
    of its seed (``eval/accuracy`` = solved / PROMPTS), with final ``kl/init`` = ``kl``, ``val/accuracy`` =
    ``val``, any ``extra`` final metrics and any further ``overrides``. ``retained`` = (at step 0, at the end):
    how many of the seed's easiest retention prompts its ``eval/retention`` evaluations solve; ``start_extra``:
    metrics logged at step 0 too; ``kl_per_prompt``: the final ``kl/init``'s per-prompt contributions (mean ``kl``);
    ``val_outcomes``: validation metric -> its final per-prompt scores (split ``val``), the metric's final value their
    mean."""
    run_dir = root / "-".join([arm, f"{beta:g}", str(seed), *overrides])
    (run_dir / layout.HYDRA_DIR).mkdir(parents=True)
    (run_dir / layout.HYDRA_DIR / "overrides.yaml").write_text(
        yaml.safe_dump([f"grpo_variant={arm}", f"algo.beta={beta:g}", f"training.seed={seed}", *overrides]))
    write_resolved_config(run_dir, {
        "algo": {"name": "grpo", "beta": beta}, "reference": {"name": "fixed" if arm == "fixed" else "ema"},
        "eval": {"num_prompts": PROMPTS}, "training": {"seed": seed, "steps": STEPS, "num_threads": 2},
        "comparison": decl})
    scores = np.zeros(PROMPTS)
    scores[ranking(seed)[:solved]] = 1.0
    final = {"eval/accuracy": float(scores.mean()), "kl/init": kl, **({"val/accuracy": val} if val is not None
                                                                       else {}), **(extra or {}),
             **{m: float(np.mean(v)) for m, v in (val_outcomes or {}).items()}}
    first = {"step": 0, "eval/accuracy": 0.0, "kl/init": 0.0, **(start_extra or {})}
    kept = []
    if retained is not None:
        kept = [np.zeros(PROMPTS), np.zeros(PROMPTS)]
        for k, n in zip(kept, retained):
            k[ranking(seed + 50)[:n]] = 1.0
        first["eval/retention"], final["eval/retention"] = float(kept[0].mean()), float(kept[1].mean())
    log = MetricsWriter(run_dir)
    log.write(first)
    log.write({"step": STEPS, **final})
    log.close()
    ids = list(range(PROMPTS))
    retention = [EvalOutcomes("retain_eval", "eval/retention", ids, k.tolist()) for k in kept]
    if retention:
        append_outcomes(run_dir, 0, retention[:1])
    drift = ([EvalOutcomes("eval", "kl/init", list(range(len(kl_per_prompt))), list(kl_per_prompt))]
             if kl_per_prompt is not None else [])
    validation = [EvalOutcomes("val", m, list(range(len(v))), list(v)) for m, v in (val_outcomes or {}).items()]
    append_outcomes(run_dir, STEPS, [EvalOutcomes("eval", "eval/accuracy", ids, scores.tolist()), *retention[1:],
                                     *drift, *validation])
    write_status(run_dir, {"status": "completed", "algo": "grpo", "seed": seed, "steps": STEPS, "last_step": STEPS,
                           "final": final, "provenances": [{"commit": "abc"}]})
    return run_dir


def frontier_sweep(root: Path, select: Optional[dict] = None, gap: Optional[float] = 5.0,
                   kl_noise: Optional[float] = None, **declared) -> None:
    """fixed: kl/init 0.1..100 across beta. ema: the same drift, 19, 20, 21 prompts more at each beta in seeds 0,
    1, 2 (it dominates). drifter: half a decade more drift at every beta and 9, 10, 11 prompts more, i.e. on
    fixed's own accuracy-vs-drift line on average: ahead at every beta, level at every drift. (Seeds differ, so
    the Student t over them has a spread: identical per-seed differences make a degenerate t, no claim.)
    ``declared``: further fields of the comparison block (primary, matched, equivalence_margin)."""
    decl = {**block(["fixed", "ema", "drifter"], select=select, gap=gap), **declared}
    for seed in (0, 1, 2):
        for beta in BETAS:
            i = LEVEL[beta]
            ret = lambda kl: {"eval/retention": 0.8 - 0.1 * math.log10(kl)}  # noqa: E731
            for arm, shift, more in (("fixed", 0.0, 0), ("ema", 0.0, 19 + seed), ("drifter", 0.5, 9 + seed)):
                kl = 10 ** (i - 1 + shift)
                solved = 60 + 20 * i + 2 * seed + more
                per_prompt = None
                if kl_noise is not None:  # 256 prompts' contributions, mean exactly kl, relative spread kl_noise
                    z = np.random.default_rng([seed, i, len(arm)]).standard_normal(256)
                    per_prompt = (kl * (1 + kl_noise * (z - z.mean()) / z.std())).tolist()
                write_run(root, arm, beta, seed, solved=solved, kl=kl, decl=decl, val=solved / PROMPTS, extra=ret(kl),
                          kl_per_prompt=per_prompt)
