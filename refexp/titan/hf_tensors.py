"""Native tensors <-> an HF checkpoint's tensors: torchtitan's state-dict adapter (names, llama's Q/K
permutation for RoPE) and the fused Q/K/V projection, split for export and fused after loading, on
each rank's shards where they hold whole KV groups (docs/torchtitan-notes.md §15).
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor import empty as dtensor_empty
from torch.distributed.tensor.placement_types import _StridedShard  # FSDP2's row sharding over TP
from torchtitan.models.common import FusedQKVLinear

from refexp.config import ModelConfig
from refexp.titan.families import model_family
from refexp.titan.lora import is_adapter_name
from refexp.titan.unwrap import canonical_name, decoder_of, local_tensor, reshard_fsdp


def state_dict_adapter(model: nn.Module, model_cfg: ModelConfig):
    """torchtitan's HF state-dict adapter for ``model`` (``to_hf``/``from_hf``: names and permutations)."""
    spec = model_family(model_cfg.name).registry.model_registry(model_cfg.flavor)
    # hf_assets_path=None: the adapter only uses it to look for a safetensors index when *saving*
    # sharded HF files, and warns when there is none.
    return spec.state_dict_adapter(decoder_of(model).config, None)


def _fused_qkv_modules(model: nn.Module) -> dict[str, FusedQKVLinear]:
    """Canonical prefix (``layers.0.attention.qkv_linear.``) -> fused Q/K/V projection."""
    return {canonical_name(n) + ".": m for n, m in decoder_of(model).named_modules() if isinstance(m, FusedQKVLinear)}


def _qkv_shapes(module: FusedQKVLinear) -> dict[str, tuple[int, int]]:
    """Global shapes of the unfused ``wq``/``wk``/``wv`` weights of a fused [n_kv * R * head_dim, dim] ``wqkv``."""
    rows, dim = module.wqkv.weight.shape
    kv_rows = rows // module.r_dim
    return {"wq": (kv_rows * module.heads_per_kv, dim), "wk": (kv_rows, dim), "wv": (kv_rows, dim)}


def _n_kv_groups(module: FusedQKVLinear) -> int:
    return module.wqkv.weight.shape[0] // (module.r_dim * module.head_dim)


def _merges_locally(wqkv: torch.Tensor, n_kv: int) -> bool:
    """Whether this rank's rows of ``wqkv`` are whole KV groups whose wq/wk/wv rows are the same ranks'
    chunks of wq/wk/wv laid out like ``wqkv``, so fusing local shards gives the local shard of ``wqkv``.

    ``wqkv`` interleaves [n_kv, R, head_dim] rows (FusedQKVLinear). Row sharding (FSDP's
    ``Shard(0)``/``_StridedShard(0)``, TP's colwise ``Shard(0)``) gives every rank one contiguous block
    of each tensor at the same index, so when the shard counts multiply to a divisor of n_kv all four
    tensors are cut at the same group boundaries. Mesh dims of size 1 do not cut anything.
    """
    if not isinstance(wqkv, DTensor):
        return True
    shards = 1
    for size, placement in zip(wqkv.device_mesh.shape, wqkv.placements):
        if size == 1 or isinstance(placement, Replicate):
            continue
        if not (isinstance(placement, (Shard, _StridedShard)) and placement.dim == 0):
            return False
        shards *= size
    return n_kv % shards == 0


def _empty_like_layout(like: torch.Tensor, shape: tuple[int, ...], *, local: bool) -> torch.Tensor:
    """An uninitialised tensor of global ``shape`` with ``like``'s dtype and device: sharded like ``like``
    when ``local``, else replicated (each rank then reads the whole tensor)."""
    if not isinstance(like, DTensor):
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    placements = like.placements if local else [Replicate()] * like.device_mesh.ndim
    return dtensor_empty(*shape, dtype=like.dtype, device_mesh=like.device_mesh, placements=placements)


def native_load_targets(model: nn.Module) -> dict[str, torch.Tensor]:
    """Where each native (unfused ``wq``/``wk``/``wv``) tensor is read into, by canonical name.

    A parameter is its own target (DCP reads this rank's shard straight into it, tied weights
    under each name); a fused ``wqkv`` gets three fresh targets, fused by ``fuse_qkv_``. A LoRA policy's adapters
    and reference parts (``titan/lora.py``) are not in a start checkpoint: they keep their initial values.
    """
    reshard_fsdp(model)
    fused = _fused_qkv_modules(model)
    targets = {}
    for name, param in decoder_of(model).named_parameters(remove_duplicate=False):
        name = canonical_name(name)
        if is_adapter_name(name):
            continue
        prefix = name.removesuffix("wqkv.weight")
        if name.endswith("wqkv.weight") and prefix in fused:
            module = fused[prefix]
            local = _merges_locally(param, _n_kv_groups(module))
            for w, shape in _qkv_shapes(module).items():
                targets[f"{prefix}{w}.weight"] = _empty_like_layout(param, shape, local=local)
        else:
            targets[name] = param
    return targets


def fuse_qkv_(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy the loaded ``wq``/``wk``/``wv`` of each fused projection into its ``wqkv`` shard (popped from ``state``).

    FusedQKVLinear's own load hook does the fusing, on this rank's shards when they are whole KV
    groups (``_merges_locally``; no communication), else on full tensors cut to the shard.
    """
    for prefix, module in _fused_qkv_modules(model).items():
        param = module.wqkv.weight
        local = _merges_locally(param, _n_kv_groups(module))
        parts = {f"{prefix}{w}.weight": local_tensor(state.pop(f"{prefix}{w}.weight")) for w in ("wq", "wk", "wv")}
        FusedQKVLinear._merge_qkv_on_load(module, parts, prefix)
        fused = parts[f"{prefix}wqkv.weight"]
        if isinstance(param, DTensor) and not local:  # full tensors were read: keep this rank's shard
            fused = distribute_tensor(fused, param.device_mesh, param.placements, src_data_rank=None).to_local()
        local_tensor(param).copy_(fused)


def native_export_entries(model: nn.Module) -> list[tuple[str, torch.Tensor, FusedQKVLinear | None]]:
    """(canonical name, parameter, its fused Q/K/V module or None) for every tensor an HF export writes,
    in a fixed order (every rank gathers them in this order). A LoRA policy's adapters and reference parts are not
    among them: the export writes each adapted weight merged (``hf_weights._write_hf_weights``)."""
    reshard_fsdp(model)
    fused = _fused_qkv_modules(model)
    entries = []
    for name, param in decoder_of(model).named_parameters(remove_duplicate=False):
        name = canonical_name(name)
        if is_adapter_name(name):
            continue
        prefix = name.removesuffix("wqkv.weight")
        entries.append((name, param, fused.get(prefix) if name.endswith("wqkv.weight") else None))
    return entries


def to_hf_tensors(adapter, name: str, full: torch.Tensor, module: FusedQKVLinear | None) -> dict[str, torch.Tensor]:
    """One native tensor (a full, plain tensor; meta for planning) as HF tensors: a fused ``wqkv`` is
    split by FusedQKVLinear's own save hook; the adapter renames (and permutes llama's Q/K).
    Empty when the adapter drops it (a tied ``lm_head``)."""
    state = {name: full}
    if module is not None:
        FusedQKVLinear._split_qkv_on_save(module, state, name.removesuffix("wqkv.weight"), None)
    return adapter.to_hf(state)
