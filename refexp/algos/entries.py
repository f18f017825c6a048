"""The algorithm table: ``algo.name`` -> its entry point, ``entry(ctx, sft_dir, summary) -> final metrics``.

``run`` (``refexp/run.py``) makes or finds the SFT model every algorithm starts from (``sft_dir`` and its
``sft.json``, ``summary``) and calls the entry; the entry builds what only its algorithm needs (GRPO: the learned
rewards, from the SFT model's reward-model stage when a field names ``rm``) and trains. The algorithms' modules
are imported when their entry runs, so a run imports only its own.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

from refexp.components.context import RunContext
from refexp.record.metric_names import EVAL_ACCURACY

Entry = Callable[[RunContext, Path, dict], dict]


def sft(ctx: RunContext, sft_dir: Path, summary: dict) -> dict:
    """``algo=sft``: the stage alone. Its curve goes to this run's log (also when the stage was cached)."""
    from refexp.record.metrics import read_metrics

    for row in read_metrics(sft_dir):
        ctx.logger.log({k: v for k, v in row.items() if k != "step"}, step=row["step"])
    final = {EVAL_ACCURACY: summary["eval_accuracy"], "step": summary["steps"], "sft/wall_s": summary["wall_s"],
             "sft/dir": str(sft_dir)}
    if summary.get("val_accuracy") is not None:
        final["sft/val_accuracy"] = summary["val_accuracy"]
    if ctx.dist.is_rank0:
        band = (f", validation {summary['val_accuracy']:.3f} of the {summary['val_ceiling']:.3f} imitating the "
                "demonstrations allows" if summary.get("val_ceiling") is not None
                and summary.get("val_accuracy") is not None else "")
        print(f"[refexp] SFT model: {sft_dir} (test accuracy {summary['eval_accuracy']:.3f}{band} after "
              f"{summary['steps']} steps, stopped by {summary.get('stopped_by', 'cap')})")
    return final


def rm(ctx: RunContext, sft_dir: Path, summary: dict) -> dict:
    """``algo=rm``: a reward model trained on the SFT model's verifier-labelled samples."""
    from refexp.algos.rm import run_rm

    return run_rm(ctx, sft_dir)


def grpo(ctx: RunContext, sft_dir: Path, summary: dict) -> dict:
    """``algo=grpo``, on a task whose learned rewards (``task.reward_model`` & co.) are built first."""
    from refexp.algos.grpo import train_grpo

    return train_grpo(with_learned_rewards(ctx, sft_dir), sft_dir)


def with_learned_rewards(ctx: RunContext, sft_dir: Path) -> RunContext:
    """``ctx`` with a task that scores with its learned rewards (``refexp.tasks.reward_sum.with_rewards``), built
    here, where the SFT model they may need exists (``rm``: the reward-model stage's, cached or made now); ``ctx``
    itself when the task has none."""
    if not ctx.cfg.task.learned_rewards():
        return ctx
    from refexp.algos.rm import ensure_rm
    from refexp.tasks.reward_sum import names_stage_model, with_rewards

    rm_dir = ensure_rm(ctx, sft_dir) / "hf" if names_stage_model(ctx.cfg.task) else None
    identity = ctx.identity
    if ctx.dist.is_rank0 and identity is not None:  # a resume onto other reward weights is refused (run_identity)
        identity = {**identity, "pins": {**identity.get("pins", {}), **reward_model_pins(ctx.cfg.task, rm_dir)}}
    return replace(ctx, task=with_rewards(ctx.task, ctx.cfg.task, device=ctx.device, stage_model=rm_dir),
                   identity=identity)


def reward_model_pins(task_cfg, rm_dir: Path | None) -> dict:
    """``{role: pin}`` (``refexp/record/pins.py``) of each reward model the task scores with that is a local dir
    (the reward-model stage's ``rm_dir`` for ``rm``); a Hub id is in the config, by name."""
    from refexp.record.pins import pin
    from refexp.tasks.reward_model import STAGE_MODEL

    named = {"task.reward_model": task_cfg.reward_model, "task.gold_reward_model": task_cfg.gold_reward_model,
             **{f"task.reward_funcs[{i}]": f for i, f in enumerate(task_cfg.reward_funcs)}}
    pins = {}
    for role, name in named.items():
        local = isinstance(name, str) and Path(name).is_dir()
        path = rm_dir if name == STAGE_MODEL else (Path(name) if local else None)
        if path is not None:
            pins[role] = pin(path)
    return pins


def dpo(ctx: RunContext, sft_dir: Path, summary: dict) -> dict:
    """``algo=dpo``."""
    from refexp.algos.dpo import train_dpo

    return train_dpo(ctx, sft_dir)


ALGORITHMS: dict[str, Entry] = {"sft": sft, "rm": rm, "grpo": grpo, "dpo": dpo}
"""Every ``algo.name`` and its entry point."""
