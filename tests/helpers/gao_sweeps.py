"""Synthetic learned-reward sweeps for the Gao-form tests: GRPO runs of several arms across ``algo.beta`` and seeds,
written with the run record's writers, each logging ``kl/init``, ``eval/gold`` and the proxy ``eval/accuracy`` at
every evaluation, whose gold changes from its step-0 value by a known d (alpha_rl - beta_rl log d),
d = sqrt(kl/init)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import yaml

from refexp.record import layout
from refexp.record.metrics import MetricsWriter
from refexp.record.resolved_config import write_resolved_config
from refexp.record.status import write_status
from tests.helpers.frontier_sweeps import block

STEPS, EVERY = 60, 10
GOLD_0 = 0.6
"""Every run's step-0 gold: the form is fitted to the change from it."""
KL_END = {1.0: 0.5, 0.1: 2.0, 0.01: 6.0}
"""algo.beta -> the run's final kl/init (its kl/init grows linearly in the step up to it)."""
FORMS = {"fixed": (0.5, 0.4), "ema": (0.3, 0.1)}
"""arm -> (alpha_rl, beta_rl): fixed peaks at d* = exp(0.25) ~ 1.28, inside the drift it reaches; ema at exp(2) ~ 7.4,
beyond it."""


def delta_gold(alpha_rl: float, beta_rl: float, d: np.ndarray) -> np.ndarray:
    """The form by hand: d (alpha_rl - beta_rl log d), 0 at d = 0."""
    return np.where(d > 0, d * (alpha_rl - beta_rl * np.log(np.where(d > 0, d, 1.0))), 0.0)


def write_run(root: Path, arm: str, beta: float, seed: int, *, form: tuple[float, float], noise: float, decl: dict,
              sft_seed: Optional[int] = None, steps: int = STEPS) -> Path:
    """A completed run of ``arm`` at ``beta``: evaluations every ``EVERY`` steps up to ``steps``, kl/init rising
    linearly to ``KL_END[beta]`` by ``STEPS``, eval/gold = GOLD_0 + form(d) + normal noise of sd ``noise`` (seeded
    by arm, beta and seed), and a proxy that keeps rising."""
    overrides = [f"grpo_variant={arm}", f"algo.beta={beta:g}", f"training.seed={seed}"]
    overrides += [f"sft.seed={sft_seed}"] if sft_seed is not None else []
    run_dir = root / "-".join([arm, f"{beta:g}", str(seed), *([f"s{sft_seed}"] if sft_seed is not None else [])])
    (run_dir / layout.HYDRA_DIR).mkdir(parents=True)
    (run_dir / layout.HYDRA_DIR / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    write_resolved_config(run_dir, {
        "algo": {"name": "grpo", "beta": beta}, "reference": {"name": "fixed" if arm == "fixed" else "ema"},
        "eval": {"num_prompts": 64}, "training": {"seed": seed, "steps": steps, "num_threads": 2},
        "sft": {"seed": sft_seed or 0}, "comparison": decl})
    rng = np.random.default_rng([seed, int(round(beta * 100)), len(arm), sft_seed or 0])
    log = MetricsWriter(run_dir)
    final = {}
    for step in range(0, steps + 1, EVERY):
        kl = KL_END[beta] * step / STEPS
        gold = GOLD_0 + float(delta_gold(*form, np.sqrt(kl))) + (noise * rng.standard_normal() if step else 0.0)
        final = {"kl/init": kl, "eval/gold": gold, "eval/accuracy": 0.5 + 0.1 * np.sqrt(kl)}
        log.write({"step": step, **final, "reward/mean": final["eval/accuracy"]})
    log.close()
    write_status(run_dir, {"status": "completed", "algo": "grpo", "seed": seed, "steps": steps, "last_step": steps,
                           "final": final, "provenances": [{"commit": "abc"}]})
    return run_dir


def gao_sweep(root: Path, *, noise: float = 0.01, seeds=(0, 1, 2), forms: Optional[dict] = None,
              sft_seeds=(None,), declared: bool = True) -> dict:
    """Both arms (``FORMS``, or ``forms``) at every beta of ``KL_END`` and seed (and SFT start), under a declared
    block with ``algo.beta`` as the frontier key (``declared``; else an empty block: the report is exploratory);
    returns the block."""
    forms = forms or FORMS
    decl = block(list(forms), seeds=seeds) if declared else {"arm_key": "", "arms": [], "baseline": "", "seeds": []}
    for sft_seed in sft_seeds:
        for seed in seeds:
            for beta in KL_END:
                for arm, form in forms.items():
                    write_run(root, arm, beta, seed, form=form, noise=noise, decl=decl, sft_seed=sft_seed)
    return decl
