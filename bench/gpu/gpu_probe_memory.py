"""Probe of bench/gpu/gpu_check.py: one training step's peak memory with activation checkpointing none and full
(gpu_smoke's ``fig_peak_mem``: Qwen3-0.6B-shaped, 4 x 2048 tokens) against ``refexp dry_run``'s plan of the
same shape (``algo=sft`` with that batch and length: the policy, its AdamW state and one training chunk).

Per figure: ``value`` the measured MiB (CUDA: ``max_memory_allocated``; CPU: the rise of peak RSS over the
step), ``planned_mib`` the plan's training peak, ``planned_step_extra_mib`` the part of it that a step adds
to what stays resident (parameters, optimizer state, references), ``measured_over_plan`` the measured peak
over the planned one on CUDA and the measured rise over the planned step extra on CPU, and the plan's lines.

    python bench/gpu/gpu_probe_memory.py [--toy] [--budget-s N] [gpu_smoke.py's other options]
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # bench/gpu/ (these modules) and bench/ (_common.py)

import gpu_adapters as A  # noqa: E402
from gpu_probe import run_probe  # noqa: E402

FIGURES = ("peak_mem_mib_ac_none", "peak_mem_mib_ac_full")
RESIDENT = ("parameters", "optimizer state", "reference", "kl/init anchor")
MIB = 2**20


def plan_overrides(bench, ac_mode: str) -> list[str]:
    """The dry-run overrides of gpu_smoke's training step: its model shape, rows and tokens per row."""
    s, cfg = bench.sizes, bench.model_cfg()
    model = [f"model.{k}={getattr(cfg, k)}" for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden_dim",
                                                       "vocab_size") if getattr(cfg, k) is not None]
    out = ["algo=sft", "model=qwen3_0.6b", *model, f"sft.batch_size={s.batch}",
           f"task.max_prompt_len={s.seq_len // 2}", f"task.max_new_tokens={s.seq_len - s.seq_len // 2}",
           "eval.num_prompts=1", f"training.device={bench.device.type}", f"activation_checkpoint={ac_mode}",
           "logger=none"]
    if bench.args.mixed_precision != "auto":
        out.append(f"training.mixed_precision_param={bench.args.mixed_precision}")
    return out


def fig_against_plan(bench, ac_mode: str) -> dict:
    measured = bench.fig_peak_mem(ac_mode)
    lines = A.plan_lines(plan_overrides(bench, ac_mode))
    planned, line = A.planned_training_peak(lines)
    extra = planned - sum(lines.get(k, 0.0) for k in RESIDENT)
    if measured["measure"] == "cuda_max_memory_allocated":
        ratio = measured["value"] * MIB / planned
    else:  # a rise of RSS: what the step added, not the process's peak
        ratio = measured["value"] * MIB / extra
    return {**measured, "planned_mib": round(planned / MIB, 1), "planned_line": line,
            "planned_step_extra_mib": round(extra / MIB, 1), "measured_over_plan": round(ratio, 3),
            "plan_mib": {k: round(v / MIB, 2) for k, v in lines.items()}}


def main(argv=None) -> dict:
    def figures(runner, bench):
        for ac_mode in ("none", "full"):
            runner.run(f"peak_mem_mib_ac_{ac_mode}", lambda ac_mode=ac_mode: fig_against_plan(bench, ac_mode))

    return run_probe(FIGURES, figures, argv)


if __name__ == "__main__":
    main()
