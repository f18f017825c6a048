"""The RL loop both algorithms share; they differ in the step function they pass in.

Per step (DESIGN.md, "One GRPO step"): the algorithm's step -> the reference strategy's
``after_step`` (reset / EMA / KL-triggered) -> every ``eval.every`` steps the held-out
measurements -> log -> checkpoint. Around it: resume from the run dir's latest checkpoint, the
step-0 measurement on a fresh start, a SIGTERM handler that saves before exiting (SLURM
preemption), a non-finite guard that stops the run and leaves the last good checkpoint, and a
final checkpoint at the end of every run.
"""

from __future__ import annotations

import math
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from refexp import titan
from refexp.checkpoint import Checkpointer, TrainState
from refexp.context import RunContext
from refexp.evaluation import greedy_accuracy, kl_to_anchor
from refexp.logging import peak_rss_mb
from refexp.optim import build_optimizer, reset_optimizer_state
from refexp.progress import progress_bar
from refexp.reference import ReferenceStrategy, build_reference


class NonFiniteError(FloatingPointError):
    pass


class Preempted(SystemExit):
    """Raised after the checkpoint of a SIGTERM'd run has been written."""


PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)
"""SIGTERM: torchrun's and SLURM's stop; SIGUSR2: submitit's warning before a preemption or time limit."""


def _any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank when ``flag`` is set on any (a signal can reach ranks at different steps,
    and the save that follows is a collective)."""
    import torch.distributed as dist

    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return flag
    t = torch.tensor([int(flag)], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


@dataclass
class Policy:
    model: torch.nn.Module
    optimizers: object
    lr_schedulers: object


class InitAnchor:
    """The frozen initial (SFT) model that ``kl/init`` is measured against.

    With ``reference=fixed`` on the start checkpoint it *is* the reference (no second copy). Otherwise
    it is built only for the measurement and freed after it, so strategies are compared without a
    resident extra copy (``reference=none`` then holds no frozen weights during training steps).
    """

    def __init__(self, ctx: RunContext, init_path: Path, shared: ReferenceStrategy | None):
        self.ctx, self.init_path, self.shared = ctx, init_path, shared

    @contextmanager
    def logprobs(self):
        if self.shared is not None and self.shared.model is not None:  # None: released (DPO's cache)
            yield self.shared.logprobs
            return
        model = self.ctx.build_frozen(self.init_path)

        def fn(tokens_BT):
            with torch.inference_mode():
                return titan.token_logprobs(model, tokens_BT).clone()

        try:
            yield fn
        finally:
            del model


def build_policy(ctx: RunContext, init_path: Path) -> Policy:
    cfg = ctx.cfg
    model = ctx.build_model(trainable=True)
    src = cfg.checkpoint.initial_load_path or init_path
    if cfg.checkpoint.initial_load_in_hf:
        titan.load_hf_weights_(model, cfg.model, src)
    else:
        ctx.load_weights(model, src)
    t = cfg.training
    optimizers, schedulers = build_optimizer(model, optimizer=t.optimizer, lr=t.lr, beta1=t.beta1, beta2=t.beta2,
                                             eps=t.eps, weight_decay=t.weight_decay, warmup_steps=t.warmup_steps,
                                             total_steps=t.steps)
    return Policy(model, optimizers, schedulers)


def build_strategy(ctx: RunContext, init_path: Path, *, defer_build: bool = False
                   ) -> tuple[ReferenceStrategy, InitAnchor]:
    """The reference strategy (its frozen model built now, or at ``ensure_model()`` with ``defer_build``)
    and the kl/init anchor."""
    rcfg = ctx.cfg.reference
    ref_path = reference_path(ctx, init_path)
    strategy = build_reference(
        rcfg, lambda: ctx.build_frozen(ref_path, dtype=rcfg.dtype, compile_enable=rcfg.compile),
        defer_build=defer_build)
    shared = strategy if (strategy.name == "fixed" and ref_path == init_path and rcfg.dtype in (None, ctx.cfg.training.dtype)) else None
    return strategy, InitAnchor(ctx, init_path, shared)


def reference_path(ctx: RunContext, init_path: Path) -> Path:
    """The checkpoint the reference starts from: ``reference.checkpoint``, else the policy's start."""
    return Path(ctx.cfg.reference.checkpoint) if ctx.cfg.reference.checkpoint else init_path


def evaluate(ctx: RunContext, policy: torch.nn.Module, anchor: InitAnchor) -> dict[str, float]:
    ecfg = ctx.cfg.eval
    out = {"eval/accuracy": greedy_accuracy(policy, ctx.task, ecfg.num_prompts)}
    with anchor.logprobs() as ref_fn:
        out["kl/init"] = kl_to_anchor(policy, ref_fn, ctx.task, ecfg.kl_prompts, seed=ctx.cfg.training.seed)
    return out


def optimizer_step(ctx: RunContext, policy: Policy, loss: torch.Tensor, step: int, ckpt: Checkpointer) -> float:
    """backward (done by the caller) -> non-finite guard -> clip -> step. Returns the grad norm."""
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.model.parameters(), ctx.cfg.training.max_norm)
    if hasattr(grad_norm, "full_tensor"):
        grad_norm = grad_norm.full_tensor()
    gn, lv = float(grad_norm), float(loss.detach())
    if not (math.isfinite(lv) and math.isfinite(gn)):
        last = ckpt.latest_step() if ckpt is not None else -1
        raise NonFiniteError(
            f"non-finite {'loss' if not math.isfinite(lv) else 'gradient norm'} at step {step} "
            f"(loss={lv}, grad_norm={gn}); stopping without applying the update. "
            + (f"The last good checkpoint is step-{last} in {ckpt.folder}." if last >= 0 else "No checkpoint was written yet.")
        )
    policy.optimizers.step()
    policy.lr_schedulers.step()
    policy.optimizers.zero_grad()
    return gn


def run_loop(ctx: RunContext, policy: Policy, strategy: ReferenceStrategy, anchor: InitAnchor,
             step_fn: Callable[[int, "Checkpointer"], dict], *, extra_states: dict | None = None,
             desc: str = "train") -> dict:
    """Drive ``step_fn(step, ckpt) -> metrics`` from the resumed step to ``training.steps``."""
    cfg = ctx.cfg
    state = TrainState()
    states = {"train_state": state, "reference": strategy, **(extra_states or {})}
    ckpt = Checkpointer(cfg.checkpoint, ctx.run_dir, model=policy.model, optimizers=policy.optimizers,
                        lr_schedulers=policy.lr_schedulers, states=states)
    resumed = ckpt.resume()
    start = state.step if resumed else 0
    last_eval: dict[str, float] = {}
    # Rows logged after the checkpoint (all rows, when there is none) are from an attempt that was
    # killed: the steps are run again and logged once.
    ctx.logger.truncate_after(start if resumed else -1)
    if resumed:
        if ctx.dist.is_rank0:
            print(f"[refexp] resumed {ctx.run_dir} at step {start}")
    else:
        last_eval = evaluate(ctx, policy.model, anchor)
        ctx.logger.log({**last_eval, **strategy.metrics()}, step=0)

    preempted: dict = {"signum": None}
    prev = {s: signal.signal(s, lambda signum, _frame: preempted.__setitem__("signum", signum))
            for s in PREEMPT_SIGNALS}
    bar = progress_bar(total=cfg.training.steps, initial=start, desc=desc,
                       enabled=ctx.dist.is_rank0 and cfg.logger.progress)
    metrics: dict = {}
    step = start
    try:
        for step in range(start + 1, cfg.training.steps + 1):
            t0 = time.perf_counter()
            metrics = step_fn(step, ckpt)
            strategy.after_step(step, policy.model, metrics)
            if strategy.reset_optimizer_requested:
                reset_optimizer_state(policy.optimizers)
                strategy.reset_optimizer_requested = False
            metrics.update(strategy.metrics())
            metrics["perf/step_s"] = time.perf_counter() - t0
            metrics["mem/peak_rss_mb"] = peak_rss_mb()
            if ctx.device.type == "cuda":
                metrics["mem/peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
            if step % cfg.eval.every == 0 or step == cfg.training.steps:
                last_eval = evaluate(ctx, policy.model, anchor)
                metrics.update(last_eval)
            ctx.logger.log(metrics, step=step)
            state.step = step
            bar.update(1)
            bar.set_postfix(reward=f"{metrics.get('reward/mean', metrics.get('rewards/accuracy', 0.0)):.2f}")
            if step < cfg.training.steps:
                ckpt.save(step)
            if _any_rank(preempted["signum"] is not None, ctx.device):
                if ckpt.latest_step() != step:
                    ckpt.save(step, force=True)
                chained = prev.get(preempted["signum"])
                if callable(chained):  # submitit's handler requeues the job, now that the checkpoint exists
                    chained(preempted["signum"], None)
                raise Preempted(f"stop signal received: saved step {step} to {ckpt.folder}; "
                                f"rerun the same run dir to resume")
        if cfg.checkpoint.enable and ckpt.latest_step() != step:
            ckpt.save(step, force=True)  # the end of a run always writes a checkpoint
        if cfg.checkpoint.last_save_in_hf:
            titan.export_hf(policy.model, cfg.model, str(ctx.run_dir / cfg.checkpoint.folder / "hf"))
    finally:
        bar.close()
        for s, handler in prev.items():
            signal.signal(s, handler)
        ckpt.close()
    final = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
    if not metrics:  # resumed at the end: no step ran in this process, so measure the final policy here
        last_eval = evaluate(ctx, policy.model, anchor)
    final.update(last_eval)
    final["step"] = step
    return final
