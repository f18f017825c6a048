"""The models of a run, built from its config: the policy (trainable) and frozen copies loaded from a
checkpoint (the reference, the kl/init anchor, the model that samples DPO pairs).

Every model gets the run's family/shape, device, dtype, seed, parallelism (FSDP/TP mesh) and compute
dtype (``training.mixed_precision_param``), so a frozen copy shards and computes exactly like the policy
it is compared with (at policy == reference the KL is exactly 0, in bf16 too).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from refexp import titan
from refexp.components.context import RunContext
from refexp.config.model import LORA_REFERENCE_STATE, LoRAConfig


def build_run_model(ctx: RunContext, *, trainable: bool, seed: int | None = None, dtype: str | None = None,
                    compile_enable: bool | None = None, weights_loaded_next: bool = False,
                    lora: LoRAConfig | None = None) -> torch.nn.Module:
    """A model of the configured family/shape with the run's parallelism and compute dtype (weights: fresh
    init, from ``seed``, default ``training.seed``); ``dtype``/``compile_enable`` override the training ones.
    A trainable model gets ``activation_checkpoint``; frozen copies have no backward to recompute for.
    ``weights_loaded_next``: a checkpoint is loaded right after, so each rank allocates only its shards
    (``titan.build_model``). ``lora``: adapters on it (the RL stage's policy only), each layer keeping the part its
    reference strategy needs (``config.model.LORA_REFERENCE_STATE``)."""
    cfg = ctx.cfg
    compile_cfg = cfg.compile
    if compile_enable is not None and compile_enable != compile_cfg.enable:
        compile_cfg = replace(compile_cfg, enable=compile_enable)
    model = titan.build_model(
        cfg.model,
        vocab_size=ctx.task.tokenizer.vocab_size,
        device=ctx.device,
        dtype=dtype or cfg.training.dtype,
        seed=cfg.training.seed if seed is None else seed,
        mesh=ctx.parallel_dims,
        parallelism=cfg.parallelism,
        compile_cfg=compile_cfg,
        training_cfg=cfg.training,
        requires_grad=trainable,
        ac_cfg=cfg.activation_checkpoint if trainable else None,
        weights_loaded_next=weights_loaded_next,
        lora=lora,
        lora_reference=LORA_REFERENCE_STATE[cfg.reference.name],
    )
    if not trainable:
        model.eval()
    return model


def build_frozen(ctx: RunContext, checkpoint: str | Path, *, dtype: str | None = None,
                 compile_enable: bool | None = None) -> torch.nn.Module:
    """A frozen (no grad, no optimizer state, eval mode) copy with the weights of ``checkpoint``."""
    model = build_run_model(ctx, trainable=False, dtype=dtype, compile_enable=compile_enable,
                            weights_loaded_next=True)
    titan.load_weights(model, ctx.cfg.model, checkpoint)  # a refexp/DCP dir or an HF safetensors dir
    return model
