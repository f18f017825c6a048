"""The policy's optimizer and LR schedule: torchtitan's ``OptimizersContainer`` and ``LRSchedulersContainer``.

Using torchtitan's containers (not a bare ``torch.optim.AdamW``) gives the FQN-keyed, reshardable
optimizer state dict that its ``CheckpointManager`` saves, so a run saved on 2 ranks resumes on 1.
The schedule is linear warm-up then constant: a decay tied to ``training.steps`` would change the
LR of already-run steps when a finished run is continued with a larger ``training.steps``.
"""

from __future__ import annotations

import torch


def build_optimizer(model: torch.nn.Module, *, optimizer: str, lr: float, beta1: float = 0.9, beta2: float = 0.95,
                    eps: float = 1e-8, weight_decay: float = 0.0, warmup_steps: int = 0, total_steps: int = 1):
    """(optimizers, lr_schedulers) for a model whose trainable parameters all share one group."""
    from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer
    from torchtitan.components.optimizer.optimizer import OptimizersContainer, ParamGroupConfig

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
    sched_cfg = LRSchedulersContainer.Config(warmup_steps=int(warmup_steps), total_steps=total,
                                             decay_ratio=0.0)
    return optimizers, sched_cfg.build(optimizers=optimizers, training_steps=total)


def reset_optimizer_state(optimizers) -> None:
    """Forget Adam moments (ProRL resets them together with the reference)."""
    for opt in optimizers:
        opt.state.clear()
