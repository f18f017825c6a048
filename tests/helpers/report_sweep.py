"""The synthetic sweep of the report's tests (tests/test_report.py; tests/test_wandb.py logs it), written with known
numbers:

GRPO  fixed ×3 seeds, periodic_reset reset_every=20 ×3, periodic_reset reset_every=50 ×1,
      ema ×5 seeds, kl_triggered: one failed run (traceback) + one killed run (no status.json,
      half-written last metrics line);
DPO   fixed ×2, none ×2, nested one level deeper (dpo/0, dpo/1, ...).
"""

from __future__ import annotations

import json

import numpy as np
import yaml

STEPS = 40
EVAL_EVERY = 10


def grpo_rows(strategy: str, seed: int, reset_every: int | None, stop_at: int | None = None) -> list[dict]:
    """Metrics with a strategy-specific level and a seed-specific wobble; deterministic."""
    rng = np.random.default_rng(1000 * seed + len(strategy) + (reset_every or 0))
    level = {"fixed": 0.50, "periodic_reset": 0.55, "ema": 0.60, "kl_triggered": 0.45}[strategy]
    rows = []
    last_reset = 0
    for step in range(0, (stop_at if stop_at is not None else STEPS) + 1):
        if reset_every and step and step % reset_every == 0:
            last_reset = step
        row = {
            "step": step,
            "reward/mean": level * step / STEPS + 0.05 * rng.random(),
            "reward/std": 0.1,
            "kl/ref": 0.001 * (step - last_reset) + 0.0005 * rng.random(),
            "loss/total": -0.1 * rng.random(),
            "perf/step_s": 1.0 + 0.2 * rng.random(),
            "perf/gen_s": 0.5,
            "perf/ref_fwd_s": 0.1 + 0.05 * rng.random() + (0.05 if strategy == "ema" else 0.0),
            "mem/peak_rss_mb": 1000 + 10 * step + 50 * rng.random(),
            "ref/version": step // reset_every if reset_every else 0,
        }
        if step % EVAL_EVERY == 0:
            # Every run starts from the same SFT model: accuracy 0.30 at step 0.
            row["eval/accuracy"] = 0.30 if step == 0 else 0.30 + level * step / STEPS * 0.6 + 0.03 * rng.random()
            row["kl/init"] = 0.002 * step + 0.001 * rng.random()
        rows.append(row)
    return rows


def dpo_rows(strategy: str, seed: int) -> list[dict]:
    rng = np.random.default_rng(77 + seed + len(strategy))
    rows = []
    for step in range(0, 21):
        row = {"step": step, "loss/total": 0.69 - 0.01 * step,
               "rewards/accuracies": 0.5 + 0.02 * step + 0.02 * rng.random(),
               "rewards/margins": 0.05 * step + 0.01 * rng.random(),
               "rewards/chosen": 0.1, "rewards/rejected": -0.1,
               "perf/step_s": 0.5, "mem/peak_rss_mb": 800.0 + step}
        if strategy != "none":
            row["perf/ref_fwd_s"] = 0.1
            row["kl/ref"] = 0.01 * step
        if step % 10 == 0:
            row["eval/accuracy"] = 0.4 + 0.01 * step + 0.01 * rng.random()
            row["kl/init"] = 0.003 * step
        rows.append(row)
    return rows


def write_run(run_dir, *, algo, strategy, seed, overrides, rows, status="completed", error=None,
               write_status=True, tail="", extra_config=None):
    (run_dir / ".hydra").mkdir(parents=True)
    config = {"algo": {"name": algo}, "reference": {"name": strategy},
              "training": {"seed": seed, "steps": STEPS},
              "hydra_dir": "${hydra:runtime.output_dir}",  # unresolvable outside Hydra: must not break
              **(extra_config or {})}
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    with open(run_dir / "metrics.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
        f.write(tail)
    if write_status:
        (run_dir / "status.json").write_text(json.dumps({
            "status": status, "error": error, "algo": algo, "reference": strategy, "seed": seed,
            "steps": STEPS, "last_step": rows[-1]["step"] if rows else 0,
            "final": {"reward/mean": rows[-1].get("reward/mean")} if rows else {}}))


TRACEBACK = ("Traceback (most recent call last):\n  File \"refexp/run.py\", line 10, in run\n"
             "RuntimeError: reference forward produced NaN log-probs")
FAILED_DIR, KILLED_DIR = "12", "13"


def make_sweep(root):
    """Write the sweep; return {(algo, label): [rows of each completed seed]}."""
    expected: dict[tuple[str, str], list[list[dict]]] = {}
    job = 0
    grpo = [("fixed", None, [0, 1, 2]), ("periodic_reset", 20, [0, 1, 2]), ("periodic_reset", 50, [0]),
            ("ema", None, [0, 1, 2, 3, 4])]
    for strategy, reset_every, seeds in grpo:
        label = strategy + (f" (reference.reset_every={reset_every})" if reset_every else "")
        for seed in seeds:
            overrides = ["algo=grpo", f"reference={strategy}", f"training.seed={seed}",
                         "hydra.launcher.n_jobs=2"]
            if reset_every:
                overrides.insert(2, f"reference.reset_every={reset_every}")
            rows = grpo_rows(strategy, seed, reset_every)
            write_run(root / str(job), algo="grpo", strategy=strategy, seed=seed, overrides=overrides,
                       rows=rows)
            expected.setdefault(("grpo", label), []).append(rows)
            job += 1
    assert job == 12
    write_run(root / FAILED_DIR, algo="grpo", strategy="kl_triggered", seed=0,
               overrides=["algo=grpo", "reference=kl_triggered", "training.seed=0"],
               rows=grpo_rows("kl_triggered", 0, None, stop_at=7), status="failed", error=TRACEBACK)
    write_run(root / KILLED_DIR, algo="grpo", strategy="kl_triggered", seed=1,
               overrides=["algo=grpo", "reference=kl_triggered", "training.seed=1"],
               rows=grpo_rows("kl_triggered", 1, None, stop_at=5), write_status=False,
               tail='{"step": 6, "reward/me')
    for i, (strategy, seed) in enumerate([("fixed", 0), ("fixed", 1), ("none", 0), ("none", 1)]):
        rows = dpo_rows(strategy, seed)
        write_run(root / "dpo" / str(i), algo="dpo", strategy=strategy, seed=seed,
                   overrides=["algo=dpo", f"reference={strategy}", f"training.seed={seed}"], rows=rows)
        expected.setdefault(("dpo", strategy), []).append(rows)
    return expected
