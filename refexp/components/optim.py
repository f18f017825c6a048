"""The policy's optimizer and LR schedule (torchtitan's ``OptimizersContainer`` and ``LRSchedulersContainer``),
and the one update step every training loop takes with them (``clip_and_step``).

Using torchtitan's containers (not a bare ``torch.optim.AdamW``) gives the FQN-keyed, reshardable
optimizer state dict that its ``CheckpointManager`` saves, so a run saved on 2 ranks resumes on 1.
The schedule is linear warm-up then constant: a decay tied to ``training.steps`` would change the
LR of already-run steps when a finished run is continued with a larger ``training.steps``.
"""

from __future__ import annotations

import math

import torch


def build_optimizer(model: torch.nn.Module, *, optimizer: str, lr: float, beta1: float = 0.9, beta2: float = 0.95,
                    eps: float = 1e-8, weight_decay: float = 0.0, warmup_steps: int = 0, total_steps: int = 1,
                    decay_ratio: float = 0.0, decay_type: str = "linear"):
    """(optimizers, lr_schedulers) for a model whose trainable parameters all share one group; the LR
    decays to 0 over the last ``decay_ratio`` of the steps after warm-up (torchtitan's warm-up/stable/decay;
    0 = constant after warm-up, what the RL loops use: see the module docstring)."""
    from refexp.titan.optim_checkpoint import LRSchedulersContainer, OptimizersContainer, ParamGroupConfig

    kwargs = {"lr": lr, "weight_decay": weight_decay}
    if optimizer in ("Adam", "AdamW"):
        kwargs.update(betas=(beta1, beta2), eps=eps)
    cfg = OptimizersContainer.Config(
        param_groups=[ParamGroupConfig(pattern=".*", optimizer_name=optimizer, optimizer_kwargs=kwargs)],
        # fused on CUDA. On CPU torch's fused AdamW is 5x faster (bench/README.md) but its per-shard
        # rounding made 2-process FSDP runs differ from 1-process ones by ~3e-5 (> the 1e-5 the
        # distributed tests hold), so CPU keeps foreach.
        implementation="fused" if next(model.parameters()).device.type == "cuda" else "foreach",
    )
    optimizers = OptimizersContainer(cfg, model_parts=[model])
    total = max(int(total_steps), int(warmup_steps), 1)
    # torchtitan counts decay_ratio in total steps (and warns when warm-up + decay exceed them)
    ratio = float(decay_ratio) * (total - min(int(warmup_steps), total)) / total
    sched_cfg = LRSchedulersContainer.Config(warmup_steps=int(warmup_steps), total_steps=total,
                                             decay_ratio=ratio, decay_type=decay_type)
    return optimizers, sched_cfg.build(optimizers=optimizers, training_steps=total)


def reset_optimizer_state(optimizers) -> None:
    """Forget Adam moments (ProRL resets them together with the reference)."""
    for opt in optimizers:
        opt.state.clear()


class NonFiniteError(FloatingPointError):
    """A loss or gradient norm that is inf/NaN: the update was not applied."""


def current_lr(optimizers) -> float:
    """The learning rate the next ``optimizers.step()`` applies (the schedule sets it in the param groups)."""
    return float(next(iter(optimizers)).param_groups[0]["lr"])


def clip_and_step(model: torch.nn.Module, optimizers, lr_schedulers, *, max_norm: float, loss: torch.Tensor,
                  step: int) -> tuple[float, float]:
    """After the caller's backward: clip the gradient norm, refuse a non-finite loss or norm, step the
    optimizer, advance the schedule, zero the gradients.

    Returns ``(grad_norm, lr)``: the norm before clipping (over all shards) and the learning rate this
    update used, read before the schedule advances (reading it after would give the next step's).
    Raises ``NonFiniteError`` without touching the weights, so the newest verified checkpoint stays the
    last good state (``refexp.algos.loop.optimizer_step`` names it).
    """
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP/TP: the global norm
        grad_norm = grad_norm.full_tensor()
    gn, lv = float(grad_norm), float(loss.detach())
    if not (math.isfinite(lv) and math.isfinite(gn)):
        raise NonFiniteError(
            f"non-finite {'loss' if not math.isfinite(lv) else 'gradient norm'} at step {step} "
            f"(loss={lv}, grad_norm={gn}); stopping without applying the update."
        )
    lr = current_lr(optimizers)
    optimizers.step()
    lr_schedulers.step()
    optimizers.zero_grad()
    return gn, lr
