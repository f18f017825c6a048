"""Weights copied in memory, shard by shard, without communication: between two built models (a
reference's hard reset or EMA step, ``lerp_weights_``, with an fp32 master copy for a bf16 EMA,
``fp32_master``), to host memory and back (the SFT stage's best weights), and parameter counts. Tensors are
matched by canonical name (``unwrap.canonical_name``).
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor

from refexp.titan.unwrap import canonical_name, local_tensor, reshard_fsdp


def _named_state(model: nn.Module, *, buffers: bool = True) -> dict[str, torch.Tensor]:
    """Parameters (tied ones once) and buffers by canonical name, in their sharded form."""
    reshard_fsdp(model)
    state = {canonical_name(n): p for n, p in model.named_parameters()}
    if buffers:
        state.update({canonical_name(n): b for n, b in model.named_buffers()})
    return state


def _tensor_layout(t: torch.Tensor) -> tuple:
    if isinstance(t, DTensor):
        return ("DTensor", tuple(t.shape), tuple(t.placements), t.device_mesh.mesh_dim_names)
    return ("Tensor", tuple(t.shape))


def _paired_state(dst: nn.Module, src: nn.Module) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, dst tensor, src tensor) for every parameter and buffer; AssertionError if the two models
    do not have the same names and parallel layout."""
    dst_state, src_state = _named_state(dst), _named_state(src)
    assert dst_state.keys() == src_state.keys(), (
        f"models differ in parameters: only in dst {sorted(dst_state.keys() - src_state.keys())[:5]}, "
        f"only in src {sorted(src_state.keys() - dst_state.keys())[:5]}"
    )
    for name in dst_state:
        assert _tensor_layout(dst_state[name]) == _tensor_layout(src_state[name]), (
            f"{name}: dst {_tensor_layout(dst_state[name])} vs src {_tensor_layout(src_state[name])}; both models need "
            f"the same architecture and parallelism layout (build them with the same mesh and parallelism)"
        )
    return [(name, dst_state[name], src_state[name]) for name in dst_state]


@torch.no_grad()
def lerp_weights_(dst: nn.Module, src: nn.Module, alpha: float,
                  master: dict[str, torch.Tensor] | None = None) -> None:
    """``dst <- alpha * src + (1 - alpha) * dst`` in place on every rank's local shards; buffers copied.

    alpha=1 is an exact copy (a hard reset), 0 < alpha < 1 an EMA step (TR-DPO's soft update).
    ``master`` (``fp32_master(dst)``): the blend accumulates there in float32 and ``dst`` is cast from it.
    Without it a bf16 ``dst`` stalls: an element moves only when alpha * (src - dst) reaches half a bf16 ulp
    of it (8 significant bits), which small policy changes at alpha 0.05 mostly do not.
    ``dst`` may live in host memory while ``src`` is on the device (``reference.offload``): the source shard
    is copied to ``dst``'s device. No communication: both models must have the same parallelism layout (asserted).
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha={alpha} is invalid: expected a number in [0, 1]")
    params = {canonical_name(n) for n, _ in dst.named_parameters()}
    for name, dst_tensor, src_tensor in _paired_state(dst, src):
        dst_local, src_local = local_tensor(dst_tensor), local_tensor(src_tensor)
        if master is not None and name in master:
            acc = local_tensor(master[name])
            src_acc = src_local.to(device=acc.device, dtype=acc.dtype)
            if alpha == 1.0:
                acc.copy_(src_acc)
            else:
                acc.lerp_(src_acc, alpha)
            dst_local.copy_(acc)
        elif alpha == 1.0 or name not in params:
            dst_local.copy_(src_local)
        else:
            dst_local.lerp_(src_local.to(device=dst_local.device, dtype=dst_local.dtype), alpha)


@torch.no_grad()
def fp32_master(model: nn.Module) -> dict[str, torch.Tensor]:
    """A float32 copy of ``model``'s floating-point parameters (sharded as they are, on their device), by
    canonical name: the accumulator ``lerp_weights_`` blends into."""
    return {name: p.detach().to(torch.float32, copy=True)
            for name, p in _named_state(model, buffers=False).items() if p.is_floating_point()}


def count_parameters(model: nn.Module, *, local: bool = True) -> int:
    """Number of parameters (tied ones once): this rank's shards (``local``) or the whole model."""
    return sum((local_tensor(p) if local else p).numel() for p in _named_state(model, buffers=False).values())


@torch.no_grad()
def copy_shards_to_host(model: nn.Module) -> list[torch.Tensor]:
    """Host-memory copies of this rank's parameter shards, in ``model.parameters()`` order (no communication)."""
    return [local_tensor(p).detach().to("cpu", copy=True) for p in model.parameters()]


@torch.no_grad()
def restore_shards_(model: nn.Module, saved: list[torch.Tensor]) -> None:
    """Copy ``copy_shards_to_host``'s tensors back into this rank's parameter shards, in place."""
    for shard, copy in zip([local_tensor(p) for p in model.parameters()], saved):
        shard.copy_(copy)
