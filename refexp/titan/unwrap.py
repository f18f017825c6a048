"""Seeing through what wraps a built model's modules and tensors: the decoder inside torch.compile/DDP
wrappers, parameter names without wrapper path components (docs/torchtitan-notes.md §8), a DTensor's
local shard or full tensor, and FSDP's sharded parameters put back on the modules.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor

# Wrappers that insert a path component into parameter names (docs/torchtitan-notes.md §8):
# activation checkpointing, torch.compile(model), FSDP1/DDP.
WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def canonical_name(name: str) -> str:
    """A parameter or buffer name without the wrappers' path components: the same name for the plain,
    compiled and activation-checkpointed model (``layers.0._checkpoint_wrapped_module.x`` -> ``layers.0.x``)."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def decoder_of(model: nn.Module) -> nn.Module:
    """The torchtitan Decoder inside ``torch.compile``/DDP-style wrappers."""
    while not hasattr(model, "layers"):
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if inner is None:
            raise TypeError(f"{type(model).__name__} is not a torchtitan decoder")
        model = inner
    return model


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (no communication); plain tensors pass through."""
    return t.to_local() if isinstance(t, DTensor) else t


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor gathered into a plain tensor (a collective: every rank calls it); plain tensors pass through."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def reshard_fsdp(model: nn.Module) -> None:
    """Put FSDP's sharded parameters back on the modules (local, no communication).

    After a forward without backward (or with ``fsdp_reshard_after_forward=never``) FSDP leaves
    full-weight copies registered; writing into those would be lost at the next reshard.
    """
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
