"""Which mistakes the models of a sweep make on the arithmetic task's test prompts: a missed ones-carry (the
headroom task's demonstration slip, docs/headroom-task.md), a carry added where the ones column has none,
or anything else.

For each run dir (a job of a sweep: its ``.hydra/overrides.yaml`` recomposes its config) the last checkpoint
is loaded and greedy completions of the first ``--prompts`` test prompts are classified; ``--start DIR`` also
measures the start the runs began from (an SFT output's ``model/`` under ``<sft.cache_dir>/sft/``, the one whose
``sft.json`` holds the runs' start accuracy), with the first run's config. Prints one JSON
line per run, then per group of runs (the swept variant: ``grpo_variant=``/``dpo_variant=``/``reference=``)
the counts summed over its seeds, as a markdown table.

    python bench/error_kinds.py /path/to/sweep/*/ --start ~/.cache/refexp/sft/<key>/model
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KINDS = ("correct", "missed ones-carry", "carry added without one", "other")


def classify(prompt: str, completion: str) -> str:
    """``a+b=`` and the completion -> one of KINDS."""
    a, b = (int(x) for x in prompt.rstrip("=").split("+"))
    try:
        got = int(completion.strip())
    except ValueError:
        return "other"
    ones_carry = a % 10 + b % 10 >= 10
    if got == a + b:
        return "correct"
    if ones_carry and got == a + b - 10:
        return "missed ones-carry"
    if not ones_carry and got == a + b + 10:
        return "carry added without one"
    return "other"


def compose_run_config(run_dir: Path):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from refexp.config import register_configs
    from refexp.config.root import to_object

    register_configs()
    overrides = list(OmegaConf.load(run_dir / ".hydra" / "overrides.yaml"))
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return to_object(compose("config", overrides=[f"run_dir={run_dir}", *overrides])), overrides


def group_of(overrides: list[str]) -> str:
    for key in ("grpo_variant", "dpo_variant", "reference"):
        for o in overrides:
            if o.startswith(key + "="):
                return o.split("=", 1)[1]
    return "run"


def measure(cfg, weights: Path, prompts: int) -> collections.Counter:
    from refexp import titan
    from refexp.evaluation import greedy_accuracy
    from refexp.tasks import build_task

    task = build_task(cfg.task, str(Path(cfg.sft.cache_dir).expanduser()), algo=cfg.algo.name)
    titan.prepare_torchtitan("cpu")
    model = titan.build_model(cfg.model, vocab_size=task.tokenizer.vocab_size, device="cpu", requires_grad=False)
    titan.load_weights(model, cfg.model, weights)
    samples: list = []
    greedy_accuracy(model, task, prompts, samples=samples, num_samples=prompts)
    return collections.Counter(classify(s["prompt"], s["completion"]) for s in samples)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--prompts", type=int, default=200)
    p.add_argument("--start", type=Path, default=None, help="also measure these start weights (an SFT model/ dir)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    totals: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    runs = [r for r in args.runs if (r / "checkpoint").is_dir()]
    if args.start and runs:
        cfg, _ = compose_run_config(runs[0])
        counts = measure(cfg, args.start, args.prompts)
        totals["SFT start"] = counts
        print(json.dumps({"run": "SFT start", **counts}), flush=True)
    for run in runs:
        cfg, overrides = compose_run_config(run)
        last = max((run / "checkpoint").glob("step-*"), key=lambda d: int(d.name.split("-")[1]))
        counts = measure(cfg, last, args.prompts)
        totals[group_of(overrides)] += counts
        print(json.dumps({"run": str(run), "group": group_of(overrides), "checkpoint": last.name, **counts}), flush=True)
    print(f"\n| group | {' | '.join(KINDS)} | test prompts |")
    print("|---|" + "---:|" * (len(KINDS) + 1))
    for group, counts in totals.items():
        n = sum(counts.values())
        print(f"| {group} | " + " | ".join(f"{counts[k] / n:.3f}" for k in KINDS) + f" | {n} |")


if __name__ == "__main__":
    sys.exit(main())
