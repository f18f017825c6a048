"""``compare_trl.py --mode lora``: GRPO with a LoRA policy in refexp against full fine-tuning in refexp and against
TRL + peft, each configuration in its own process, taking turns.

Sides (one process each per round; the order rotates by one each round, so each side runs first, second, ... in
turn):

  refexp_lora        refexp, ``model.lora`` (--lora-rank) on every linear layer of the blocks, a fixed reference
                     (the base with the adapters off: no second copy)
  refexp_full        refexp, the whole model trains, a fixed reference (a frozen copy)
  trl_lora           TRL's GRPOTrainer with peft's LoraConfig (target_modules="all-linear"), its reference the base
                     with the adapters disabled
  refexp_lora_noref  refexp_lora with reference=none (beta 0): what the fixed reference costs in peak memory

A round's ratios compare its own processes. FLOPs per step are each side's executed model FLOPs
(``_common.grpo_step_flops``): refexp runs a group's prompt once and the output layer at completion positions; TRL
1.16 runs one row per completion and, without Triton (any CPU), the output layer at every position.
"""

from __future__ import annotations

import json
from typing import Callable

import _common as C

SIDES = ("refexp_lora", "refexp_full", "trl_lora", "refexp_lora_noref")
LABELS = {"refexp_lora": "refexp LoRA", "refexp_full": "refexp full fine-tuning", "trl_lora": "TRL + peft LoRA",
          "refexp_lora_noref": "refexp LoRA, reference=none"}
# (key, label, target): each a per-round ratio of round_record's
RATIOS = (
    ("lora_over_trl", "refexp LoRA ÷ TRL + peft LoRA, steps/s", "≥ 1.5"),
    ("lora_over_trl_per_flop", "the same per FLOP (achieved GFLOP/s ÷ achieved GFLOP/s)", "–"),
    ("lora_over_trl_output_layer_equal", "the same with TRL's output layer at completion positions only", "–"),
    ("lora_over_full", "refexp LoRA ÷ refexp full fine-tuning, steps/s", "–"),
    ("rss_lora_over_trl", "peak RSS: refexp LoRA ÷ TRL + peft LoRA", "≤ 1"),
    ("rss_fixed_over_none", "peak RSS: refexp LoRA fixed reference ÷ reference=none", "≤ 1.05"),
)


def order_of_round(r: int) -> list[str]:
    """The sides in the order round ``r`` runs them: ``SIDES`` rotated by ``r``."""
    k = r % len(SIDES)
    return [*SIDES[k:], *SIDES[:k]]


def run(rounds: int, run_side: Callable[[str], dict]) -> list[dict]:
    """``rounds`` rounds of every side (``run_side(side)``: that side's JSON row, from its own process), each row
    and each round's record printed as a JSON line; the records."""
    records = []
    for r in range(rounds):
        order = order_of_round(r)
        got = {}
        for side in order:
            row = run_side(side)
            row.update(side=side, round=r)
            print(json.dumps(row), flush=True)
            got[side] = row
        rec = round_record(got, r, order)
        print(json.dumps(rec), flush=True)
        records.append(rec)
    return records


def _side_figures(row: dict) -> dict:
    return {"steps_per_s": row["steps_per_s"], "step_s_all": row["step_s_all"],
            "peak_rss_timed_mb": row["peak_rss_timed_mb"], "trainable_params": row["trainable_params"],
            "trunk_positions": row["trunk_positions"], "output_layer_positions": row["output_layer_positions"],
            "gflop_per_step": row["gflop_per_step"], "gflop_per_s": row["gflop_per_s"],
            "matmul_peak_gflops": row["matmul_peak_gflops"],
            "of_peak": round(row["gflop_per_s"] / row["matmul_peak_gflops"], 4)}


def round_record(got: dict[str, dict], r: int, order: list[str]) -> dict:
    """One round's figures per side and its ratios (``RATIOS``)."""
    lora, full, trl, noref = (got[s] for s in SIDES)
    ratio = lora["steps_per_s"] / trl["steps_per_s"]
    # TRL's step time as if its output layer ran at completion positions only, at its own achieved FLOP rate
    equal = ratio * trl["gflop_per_step_output_layer_at_completions"] / trl["gflop_per_step"]
    ratios = {"lora_over_trl": ratio, "lora_over_trl_per_flop": lora["gflop_per_s"] / trl["gflop_per_s"],
              "lora_over_trl_output_layer_equal": equal,
              "lora_over_full": lora["steps_per_s"] / full["steps_per_s"],
              "rss_lora_over_trl": lora["peak_rss_timed_mb"] / trl["peak_rss_timed_mb"],
              "rss_fixed_over_none": lora["peak_rss_timed_mb"] / noref["peak_rss_timed_mb"]}
    return {"bench": "compare_trl_lora_round", "round": r, "order": order,
            "sides": {s: _side_figures(got[s]) for s in SIDES}, **{k: round(v, 4) for k, v in ratios.items()}}


def _median_range(xs: list[float], fmt: str) -> str:
    return f"{C.median(xs):{fmt}} ({min(xs):{fmt}}–{max(xs):{fmt}})"


def summary(records: list[dict]) -> str:
    """The markdown tables (per side: medians and ranges over rounds; the ratios per round), after a JSON line."""
    lines = ["| configuration | s/step, each round | steps/s | peak RSS MB | trainable params | "
             "training forward positions: trunk / output layer | GFLOP/step | achieved GFLOP/s | of matmul peak |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for side in SIDES:
        figs = [rec["sides"][side] for rec in records]
        step_s = ", ".join(f"{1 / f['steps_per_s']:.2f}" for f in figs)
        lines.append(
            f"| {LABELS[side]} | {step_s} | {_median_range([f['steps_per_s'] for f in figs], '.4f')} | "
            f"{_median_range([f['peak_rss_timed_mb'] for f in figs], '.0f')} | {figs[0]['trainable_params']:,} | "
            f"{figs[0]['trunk_positions']:,} / {figs[0]['output_layer_positions']:,} | "
            f"{figs[0]['gflop_per_step']:,.1f} | {_median_range([f['gflop_per_s'] for f in figs], '.1f')} | "
            f"{_median_range([f['of_peak'] for f in figs], '.2f')} |")
    lines += ["", "| ratio | per round | median (range) | target |", "|---|---|---|---|"]
    for key, label, target in RATIOS:
        xs = [rec[key] for rec in records]
        lines.append(f"| {label} | {', '.join(f'{x:.2f}' for x in xs)} | {_median_range(xs, '.2f')} | {target} |")
    print(json.dumps({"bench": "compare_trl_lora_summary", "rounds": len(records),
                      **{key: {"median": C.median([rec[key] for rec in records]),
                               "min": min(rec[key] for rec in records), "max": max(rec[key] for rec in records)}
                         for key, _, _ in RATIOS}}), flush=True)
    table = "\n".join(lines)
    print(table, flush=True)
    return table
