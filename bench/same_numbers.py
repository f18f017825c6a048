"""Same seed, two code versions, side by side: does a refactor change any logged number?

Runs a 30-step GRPO arm of every reference strategy (the quickstart's settings) and a 30-step DPO run
with a fixed, an EMA and a precomputed reference, one thread each, into OUT/<arm>/; then, given a second
directory made the same way on another checkout, compares every logged value of every step.
Timings and memory (``perf/*``, ``mem/*``, any ``*_s`` duration such as ``refcache/build_s``) are left out
of the comparison: they are measurements of the machine, not of the run.

    python bench/same_numbers.py run OUT            # on this checkout
    python bench/same_numbers.py compare OUT_A OUT_B
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from pathlib import Path

from refexp.record.status import read_status

QUICKSTART = [
    "algo=grpo", "task.demo_slip=0.85", "training.lr=1e-4", "algo.prompts_per_step=16", "algo.group_size=8",
    "algo.beta=1.0", "eval.every=10", "eval.num_prompts=200", "eval.kl_prompts=64",
]
GRPO_ARMS = ["fixed", "periodic_reset", "ema", "kl_triggered", "none", "continued_sft"]
DPO_ARMS = {
    "dpo_fixed": ["dpo_variant=fixed"],
    "dpo_ema": ["dpo_variant=ema", "reference.sync_every=10"],
    "dpo_precomputed": ["dpo_variant=fixed", "algo.precompute_ref=true"],
}
COMMON = ["training.steps=30", "logger=none", "checkpoint=disabled", "training.num_threads=1"]
MACHINE_KEYS = ("perf/", "mem/")


def arms() -> dict[str, list[str]]:
    """Each arm's overrides, by the name of its directory under OUT."""
    out = {f"grpo_{a}": [*QUICKSTART, f"grpo_variant={a}"] for a in GRPO_ARMS}
    out.update(DPO_ARMS)
    return {name: [*overrides, *COMMON] for name, overrides in out.items()}


def run_all(out: Path) -> None:
    # Each side its own cache (SFT model, pairs, reference tables): a cache one side built would show as a
    # difference in what the other logs about building it (``refcache/built``).
    env = {**os.environ, "OMP_NUM_THREADS": "1", "REFEXP_CACHE": str(out / "cache")}
    for name, overrides in arms().items():
        run_dir = out / name
        if read_status(run_dir) is not None:
            continue
        print(f"[same_numbers] {name}", flush=True)
        subprocess.run([sys.executable, "-m", "refexp", *overrides, f"hydra.run.dir={run_dir}"],
                       check=True, env=env, stdout=subprocess.DEVNULL)


def _rows(run_dir: Path) -> list[dict]:
    from refexp.record.metrics import read_metrics  # here, so that `run` works on a checkout from before the record

    return [{k: v for k, v in row.items() if not (k.startswith(MACHINE_KEYS) or k.endswith("_s"))}
            for row in read_metrics(run_dir)]


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def compare(a: Path, b: Path) -> int:
    """Print one line per arm (identical, or the first difference); return the number of arms that differ."""
    differing = 0
    for name in arms():
        rows_a, rows_b = _rows(a / name), _rows(b / name)
        diff = None
        if len(rows_a) != len(rows_b):
            diff = f"{len(rows_a)} vs {len(rows_b)} rows"
        for ra, rb in zip(rows_a, rows_b):
            if diff:
                break
            if ra.keys() != rb.keys():
                diff = f"step {ra.get('step')}: keys differ: {sorted(ra.keys() ^ rb.keys())}"
            else:
                bad = [k for k in ra if not _same(ra[k], rb[k])]
                if bad:
                    diff = f"step {ra.get('step')}: {bad[0]} {ra[bad[0]]!r} vs {rb[bad[0]]!r}"
        values = sum(len(r) for r in rows_a)
        print(f"{name:22s} {'identical' if diff is None else 'DIFFERS: ' + diff} ({len(rows_a)} rows, {values} values)")
        differing += diff is not None
    return differing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("run").add_argument("out", type=Path)
    cmp = sub.add_parser("compare")
    cmp.add_argument("a", type=Path)
    cmp.add_argument("b", type=Path)
    args = parser.parse_args()
    if args.cmd == "run":
        run_all(args.out)
    else:
        sys.exit(1 if compare(args.a, args.b) else 0)


if __name__ == "__main__":
    main()
