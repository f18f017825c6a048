"""Which mistakes the models of a sweep make on the arithmetic task's test prompts (those of the RL skills,
``task.rl_ops``: the held-out split ``eval/accuracy`` reads): a missed ones-carry (the
headroom task's demonstration slip, docs/headroom-task.md), a carry added where the ones column has none,
or anything else.

For each run dir (a job of a sweep: its ``.hydra/overrides.yaml`` recomposes its config; a sweep dir stands for
its jobs) the last checkpoint is loaded and greedy completions of the first ``--prompts`` test prompts are
classified; ``--start DIR`` also measures the start the runs began from (an SFT output's ``model/`` under
``<sft.cache_dir>/sft/``, the one whose ``sft.json`` holds the runs' start accuracy), with the first run's config.
Prints one JSON line per run, then per group of runs (the swept variant: ``grpo_variant=``/``dpo_variant=``/
``reference=``) each kind's share of the completions pooled over its seeds, as a markdown table.

A missed ones-carry is the headroom task's own slip (``refexp.tasks.arithmetic.slip_carry``: the tens digit one
lower, mod 10, on a sum whose ones column carries, so ``0101`` -> ``0191``); a carry added without one is that slip
undone where there is no carry to forget (the tens digit one higher, mod 10). ``--markdown OUT.md`` also writes
the group table to a file to commit, naming the sweep and the start by their directory names only.

``--retention`` completes the held-out prompts of the skills RL does not train instead (``task.ops`` minus
``task.rl_ops``: the split ``eval/retention`` reads, ``Task.retain_eval``) and files them under
``retention_kinds.KINDS`` (the RL skill's answer ``a+b``, a missed or added borrow, the ones digit off by one;
``scripts/analysis/retention_kinds.py`` defines them). With ``--prompts`` at the runs' ``eval.num_prompts`` a run's
``correct`` share is its last ``eval/retention``.

    python scripts/analysis/error_kinds.py /path/to/sweep/ --start ~/.cache/refexp/sft/<key>/model --markdown docs/x.md
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import retention_kinds  # scripts/analysis/: this script's directory

from refexp.choices import ARITHMETIC_OPS
from refexp.tasks.arithmetic import format_problem, ones_carry, slip_carry

REPO = Path(__file__).resolve().parents[2]
KINDS = ("correct", "missed ones-carry", "carry added without one", "other")


def classify(prompt: str, completion: str) -> str:
    """``a<op>b=`` (zero-padded operands, an operator of ``task.ops``) and the completion -> one of KINDS, the slip
    as the task makes it. The slip's two kinds are the sums' (``+``); a wrong answer of another operator is
    ``other``."""
    op = next((o for o in ARITHMETIC_OPS if o in prompt), None)
    if op is None:
        raise ValueError(f"{prompt!r} is not a problem of the arithmetic task (no operator of {ARITHMETIC_OPS})")
    left, right = prompt.rstrip("=").split(op)
    a, b = int(left), int(right)
    _, correct, answer = format_problem(op, a, b, len(left))
    got = completion.strip()
    if not (got.isascii() and got.isdigit()):
        return "other"
    if int(got) == int(answer):
        return "correct"
    got = got.zfill(len(correct))
    if len(got) != len(correct) or op != "+":
        return "other"
    if ones_carry(op, a, b) and got == slip_carry(correct):
        return "missed ones-carry"
    if not ones_carry(op, a, b) and slip_carry(got) == correct:
        return "carry added without one"
    return "other"


@dataclass(frozen=True)
class Skills:
    """Which held-out prompts are completed and how their mistakes are filed."""

    split: str  # the ``Task`` split: ``eval`` (the RL skills) or ``retain_eval`` (the skills RL does not train)
    kinds: tuple[str, ...]
    classify: Callable[[str, str], str]  # (prompt, completion) -> one of kinds
    title: str  # the markdown file's heading, before the experiment names
    prompts_named: str  # what the markdown file calls the prompts
    script: str  # the command the markdown file names
    kinds_described: str  # the markdown file's sentence on the kinds


RL_SKILLS = Skills("eval", KINDS, classify, "Error kinds", "test prompts", "scripts/analysis/error_kinds.py",
                   "a missed ones-carry is the task's own slip, `slip_carry`; a carry added without one is that slip "
                   "undone on a sum whose ones column does not carry")
RETAINED_SKILLS = Skills("retain_eval", retention_kinds.KINDS, retention_kinds.classify, "Retained-skill error kinds",
                         "held-out prompts of the skills RL does not train (`retain_eval`, what `eval/retention` "
                         "reads)", "scripts/analysis/error_kinds.py --retention", retention_kinds.DESCRIBED)


def run_dirs(paths: list[Path]) -> list[Path]:
    """The run dirs (with a ``checkpoint/``) among ``paths``, a sweep dir standing for its jobs in job order."""
    def job_order(d: Path):
        return (0, int(d.name), "") if d.name.isdigit() else (1, 0, d.name)

    found = []
    for p in paths:
        if (p / "checkpoint").is_dir():
            found.append(p)
        elif p.is_dir():
            found += sorted((d for d in p.iterdir() if (d / "checkpoint").is_dir()), key=job_order)
    return found


def markdown_table(totals: dict[str, collections.Counter], runs_per_group: dict[str, int],
                   kinds: tuple[str, ...] = KINDS) -> str:
    """One row per group: each of ``kinds``' share of the group's completions (pooled over its runs), runs,
    completions."""
    lines = [f"| group | {' | '.join(kinds)} | runs | test completions |", "|---|" + "---:|" * (len(kinds) + 2)]
    for group, counts in totals.items():
        n = sum(counts.values())
        shares = " | ".join(f"{counts[k] / n:.3f}" if n else "-" for k in kinds)
        lines.append(f"| {group} | {shares} | {runs_per_group.get(group, 1)} | {n} |")
    return "\n".join(lines) + "\n"


def markdown_file(table: str, experiments: list[str], start: Path | None, prompts: int,
                  skills: Skills = RL_SKILLS) -> str:
    """The table with what produced it: the experiment(s) by name and the start by its SFT cache key (no machine
    paths)."""
    sweeps = ", ".join(f"`{e}`" for e in dict.fromkeys(experiments))
    start_line = (f" The SFT start is the model of SFT cache entry `{start.parent.name}`." if start else "")
    return (f"# {skills.title} of {sweeps}\n\n"
            f"Greedy completions of the first {prompts} {skills.prompts_named} of each run's last checkpoint, "
            f"classified by `{skills.script}` ({skills.kinds_described}). Shares are pooled over "
            f"each group's runs (seeds), with no interval.{start_line}\n\n{table}")


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


def measure(cfg, weights: Path, prompts: int, skills: Skills = RL_SKILLS) -> collections.Counter:
    """How many of the greedy completions of the first ``prompts`` prompts of ``skills.split`` fall in each kind."""
    from refexp import titan
    from refexp.components.evaluation import greedy_accuracy
    from refexp.tasks import build_task

    task = build_task(cfg.task, str(Path(cfg.sft.cache_dir).expanduser()), algo=cfg.algo.name)
    if getattr(task, skills.split) is None:
        raise ValueError(f"the task has no {skills.split} split (task.rl_ops trains every skill of task.ops)")
    titan.prepare_torchtitan("cpu")
    model = titan.build_model(cfg.model, vocab_size=task.tokenizer.vocab_size, device="cpu", requires_grad=False)
    titan.load_weights(model, cfg.model, weights)
    samples: list = []
    greedy_accuracy(model, task, prompts, split=skills.split, samples=samples, num_samples=prompts)
    return collections.Counter(skills.classify(s["prompt"], s["completion"]) for s in samples)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="run dirs, or sweep dirs standing for their jobs")
    p.add_argument("--prompts", type=int, default=200)
    p.add_argument("--start", type=Path, default=None, help="also measure these start weights (an SFT model/ dir)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--markdown", type=Path, default=None, help="also write the group table to this markdown file")
    p.add_argument("--retention", action="store_true",
                   help="complete the held-out prompts of the skills RL does not train (eval/retention's) instead")
    args = p.parse_args(argv)
    skills = RETAINED_SKILLS if args.retention else RL_SKILLS
    import torch

    torch.set_num_threads(args.threads)
    totals: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    runs_per_group: collections.Counter = collections.Counter()
    runs = run_dirs(args.runs)
    experiments = []
    if args.start and runs:
        cfg, _ = compose_run_config(runs[0])
        counts = measure(cfg, args.start, args.prompts, skills)
        totals["SFT start"] = counts
        print(json.dumps({"run": "SFT start", **counts}), flush=True)
    for run in runs:
        cfg, overrides = compose_run_config(run)
        experiments.append(cfg.experiment_name)
        last = max((run / "checkpoint").glob("step-*"), key=lambda d: int(d.name.split("-")[1]))
        counts = measure(cfg, last, args.prompts, skills)
        totals[group_of(overrides)] += counts
        runs_per_group[group_of(overrides)] += 1
        print(json.dumps({"run": str(run), "group": group_of(overrides), "checkpoint": last.name, **counts}),
              flush=True)
    table = markdown_table(totals, runs_per_group, skills.kinds)
    print("\n" + table, end="")
    if args.markdown:
        args.markdown.write_text(markdown_file(table, experiments, args.start, args.prompts, skills))
        print(f"wrote {args.markdown}")


if __name__ == "__main__":
    sys.exit(main())
