"""The RL loop both algorithms share; they differ in the step function they pass in.

Per step (docs/architecture.md, "One GRPO step"): the algorithm's step -> every ``eval.every`` steps
the held-out measurements -> the reference strategy's ``after_step`` (reset / EMA / KL-triggered) ->
log -> checkpoint. The measurements come before ``after_step`` so that a strategy sees the ones of
its own step: DPO's ``kl_triggered`` reads the eval-time ``kl/ref`` (docs/algorithms.md, DPO). They
measure the policy (and, for DPO, the reference as it was during the step), which ``after_step``
does not change, so for GRPO the order does not change a number.

Around it: resume from the run dir's latest checkpoint, the step-0 measurement on a fresh start, a
SIGTERM handler that saves at the end of the step before exiting (SLURM preemption; outside the loop
``refexp/runtime/stop_signals.py`` stops the run at once), a non-finite guard that stops the run
and names the newest verified checkpoint, and a final checkpoint at the end of every run.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from refexp import titan
from refexp.components.checkpoint import Checkpointer, TrainState
from refexp.components.context import RunContext
from refexp.components.evaluation import evaluate
from refexp.components.metric_logger import peak_rss_mb
from refexp.components.models import build_frozen, build_run_model
from refexp.components.optim import NonFiniteError, build_optimizer, clip_and_step, reset_optimizer_state
from refexp.components.progress import progress_bar
from refexp.components.timing import now
from refexp.record.status import beat
from refexp.reference.anchor import InitAnchor, anchor_is_reference, reference_start
from refexp.reference.lora import build_lora_reference
from refexp.reference.strategies import ReferenceStrategy, build_reference
from refexp.runtime import distributed as rdist
from refexp.runtime.stop_signals import PREEMPT_SIGNALS, Preempted, foreign


@dataclass
class Policy:
    model: torch.nn.Module
    optimizers: object
    lr_schedulers: object


def build_policy(ctx: RunContext, init_path: Path) -> Policy:
    """The policy from its start checkpoint, its optimizer and schedule; with ``model.lora`` the start's weights are
    the frozen base of adapters that alone train (and alone are in the optimizer)."""
    cfg = ctx.cfg
    model = build_run_model(ctx, trainable=True, weights_loaded_next=True,  # the start checkpoint is loaded next
                            lora=cfg.model.lora)
    src = cfg.checkpoint.initial_load_path or init_path
    # initial_load_in_hf (only with initial_load_path: CheckpointConfig) forces the HF reader on it, and its pin
    # hashes what that reader loads (run_identity.start_pins); otherwise the directory's contents decide.
    titan.load_weights(model, cfg.model, src, hf=True if cfg.checkpoint.initial_load_in_hf else None)
    t = cfg.training
    # The schedule advances once per optimizer update, and GRPO takes algo.updates_per_batch of them per step.
    updates = t.steps * getattr(cfg.algo, "updates_per_batch", 1)
    optimizers, schedulers = build_optimizer(model, optimizer=t.optimizer, lr=t.lr, beta1=t.beta1, beta2=t.beta2,
                                             eps=t.eps, weight_decay=t.weight_decay, warmup_steps=t.warmup_steps,
                                             total_steps=updates)
    return Policy(model, optimizers, schedulers)


def build_strategy(ctx: RunContext, init_path: Path, *, defer_build: bool = False,
                   policy: torch.nn.Module | None = None) -> tuple[ReferenceStrategy, InitAnchor]:
    """The reference strategy (its frozen model built now, or at ``ensure_model()`` with ``defer_build``)
    and the kl/init anchor (built at its first use and kept; both in host memory with ``reference.offload``).
    A LoRA ``policy`` (``model.lora``) holds both itself: the reference in its ``reference`` view, the anchor in its
    ``base`` view (``refexp/reference/lora.py``), no copy built."""
    rcfg = ctx.cfg.reference
    if ctx.cfg.model.lora.enabled:
        if policy is None:
            raise ValueError("model.lora: build_strategy needs the policy, whose reference and kl/init anchor it holds")
        strategy = build_lora_reference(rcfg, policy, defer_build=defer_build)
        shared = strategy if rcfg.name == "fixed" else None  # kl/ref is kl/init: the same view of the same model
        return strategy, InitAnchor(lambda: build_frozen(ctx, init_path), shared, lora_policy=policy)
    ref_path = reference_path(ctx, init_path)
    strategy = build_reference(
        rcfg, lambda: build_frozen(ctx, ref_path, dtype=rcfg.dtype, compile_enable=rcfg.compile),
        defer_build=defer_build)
    shared = strategy if anchor_is_reference(ctx.cfg, ref_path, init_path) else None
    return strategy, InitAnchor(lambda: build_frozen(ctx, init_path), shared, offload=rcfg.offload)


def reference_path(ctx: RunContext, init_path: Path) -> Path:
    """The checkpoint the reference starts from: ``reference.checkpoint``, else the policy's start."""
    return reference_start(ctx.cfg, init_path)


def optimizer_step(ctx: RunContext, policy: Policy, loss: torch.Tensor, step: int, ckpt: Checkpointer
                   ) -> tuple[float, float]:
    """After the caller's backward: clip, non-finite guard, step (``refexp.components.optim.clip_and_step``).
    Returns ``(grad_norm, lr)``, ``lr`` being the learning rate this update used."""
    try:
        return clip_and_step(policy.model, policy.optimizers, policy.lr_schedulers,
                             max_norm=ctx.cfg.training.max_norm, loss=loss, step=step)
    except NonFiniteError as e:
        last = ckpt.latest_step() if ckpt is not None else -1
        raise NonFiniteError(
            f"{e} " + (f"The newest verified checkpoint is step-{last} in {ckpt.folder}." if last >= 0
                       else "No checkpoint was written or resumed from yet.")
        ) from None


def run_loop(ctx: RunContext, policy: Policy, strategy: ReferenceStrategy, anchor: InitAnchor,
             step_fn: Callable[[int, "Checkpointer"], dict], *, extra_states: dict | None = None,
             measure: Callable[[], dict] | None = None, desc: str = "train") -> dict:
    """Drive ``step_fn(step, ckpt) -> metrics`` from the resumed step to ``training.steps``.

    ``measure() -> metrics``: the held-out measurements at step 0, every ``eval.every`` steps and at
    the end (default: ``evaluation.evaluate`` of the policy against ``anchor``).
    """
    cfg = ctx.cfg
    if measure is None:
        measure = lambda: evaluate(ctx, policy.model, anchor)  # noqa: E731
    state = TrainState()
    states = {"train_state": state, "reference": strategy, **(extra_states or {})}
    ckpt = Checkpointer(cfg.checkpoint, ctx.run_dir, model=policy.model, optimizers=policy.optimizers,
                        lr_schedulers=policy.lr_schedulers, states=states, completed_at=ctx.completed_at,
                        identity=ctx.identity)
    start, last_eval = _resume_or_measure(ctx, ckpt, state, strategy, measure)
    signals = _StopSignals()
    bar = progress_bar(total=cfg.training.steps, initial=start, desc=desc,
                       enabled=ctx.dist.is_rank0 and cfg.logger.progress)
    metrics: dict = {}
    step = start
    try:
        for step in range(start + 1, cfg.training.steps + 1):
            metrics, measured = _run_step(ctx, policy, strategy, step_fn, measure, ckpt, step,
                                          first=step == start + 1)
            if measured is not None:
                last_eval = measured
            state.step = step
            bar.update(1)
            bar.set_postfix(reward=f"{metrics.get('reward/mean', metrics.get('rewards/accuracies', 0.0)):.2f}")
            if step < cfg.training.steps:
                ckpt.save(step)
            # a signal can reach ranks at different steps, and the save that follows is a collective
            if rdist.any_rank(signals.signum is not None, ctx.device):
                signals.save_and_stop(ckpt, step)
        if cfg.checkpoint.enable and ckpt.latest_step() != step:
            ckpt.save(step, final=True)  # the end of a run always writes a checkpoint
        if cfg.checkpoint.last_save_in_hf and (ctx.completed_at is None or step > ctx.completed_at):
            titan.export_hf(policy.model, cfg.model, str(ctx.run_dir / cfg.checkpoint.folder / "hf"),
                            tokenizer=ctx.task.tokenizer)
    finally:
        bar.close()
        signals.restore()
        ckpt.close()
    if not metrics:  # resumed at the end: no step ran in this process, so measure the final policy here
        last_eval = measure()
    final = {k: v for k, v in {**metrics, **last_eval}.items() if isinstance(v, (int, float))}  # numbers only
    final["step"] = step
    return final


def _resume_or_measure(ctx: RunContext, ckpt: Checkpointer, state: TrainState, strategy: ReferenceStrategy,
                       measure: Callable[[], dict]) -> tuple[int, dict]:
    """Resume from the run dir's latest checkpoint, or measure and log step 0 on a fresh start.
    Returns the step to continue from and the step-0 measurements (empty when resumed)."""
    resumed = ckpt.resume()
    start = state.step if resumed else 0
    # Rows logged after the checkpoint (all rows, when there is none) are from an attempt that was
    # killed: the steps are run again and logged once.
    ctx.logger.truncate_after(start if resumed else -1)
    if resumed:
        if ctx.dist.is_rank0:
            print(f"[refexp] resumed {ctx.run_dir} at step {start}")
        return start, {}
    last_eval = measure()
    ctx.logger.log({**last_eval, **strategy.metrics()}, step=0)
    return start, last_eval


def _run_step(ctx: RunContext, policy: Policy, strategy: ReferenceStrategy, step_fn, measure, ckpt: Checkpointer,
              step: int, *, first: bool) -> tuple[dict, dict | None]:
    """One step of the loop: the algorithm's step, the held-out measurements when due, the reference
    strategy's update, the log row. Returns the logged metrics and the measurements (None when not due)."""
    cfg = ctx.cfg
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)  # mem/peak_gpu_mb is this step's peak
    t0 = now(ctx.device)
    metrics = step_fn(step, ckpt)
    if first:  # set-up (compilation, first allocations) is over, as in torchtitan's trainer
        rdist.set_collective_timeout(cfg.comm.train_timeout_seconds, ctx.parallel_dims)
    eval_s, measured = 0.0, None
    if step % cfg.eval.every == 0 or step == cfg.training.steps:
        t_eval = now(ctx.device)
        measured = measure()
        metrics.update(measured)
        eval_s = now(ctx.device) - t_eval
    strategy.after_step(step, policy.model, metrics)
    if strategy.reset_optimizer_requested:
        reset_optimizer_state(policy.optimizers)
        strategy.reset_optimizer_requested = False
    metrics.update(strategy.metrics())
    metrics["perf/step_s"] = now(ctx.device) - t0 - eval_s  # the step and its reference update
    metrics["mem/peak_rss_mb"] = peak_rss_mb()
    if ctx.device.type == "cuda":
        metrics["mem/peak_gpu_mb"] = torch.cuda.max_memory_allocated(ctx.device) / 2**20
    ctx.logger.log(metrics, step=step)
    if ctx.dist.is_rank0:
        beat(ctx.run_dir, step)  # status.json's heartbeat (at most every HEARTBEAT_S)
    return metrics, measured


class _StopSignals:
    """``PREEMPT_SIGNALS`` recorded (not acted on) while the loop runs, the previous handlers restored after."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.prev = {s: signal.signal(s, self._record) for s in PREEMPT_SIGNALS}

    def _record(self, signum, _frame) -> None:
        self.signum = signum

    def save_and_stop(self, ckpt: Checkpointer, step: int) -> None:
        """Checkpoint ``step`` (unless saved), hand the signal to the previous handler, raise ``Preempted``."""
        if ckpt.latest_step() != step:
            ckpt.save(step, force=True)
        chained = foreign(self.prev.get(self.signum))
        if callable(chained):  # submitit's handler requeues the job, now that the checkpoint exists
            chained(self.signum, None)
        if ckpt.completed_at is not None and ckpt.completed_at >= step != ckpt.latest_step():  # Checkpointer.save
            raise Preempted(f"stop signal received at step {step}, before this rerun passed the run dir's completed "
                            f"run: nothing saved, that run's record is unchanged")
        raise Preempted(f"stop signal received: saved step {step} to {ckpt.folder}; "
                        f"rerun the same run dir to resume")

    def restore(self) -> None:
        for s, handler in self.prev.items():
            signal.signal(s, handler)
