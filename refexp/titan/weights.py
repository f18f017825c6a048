"""Weights in and out of a built model: copy/EMA between models, snapshots, DCP and HF checkpoints.

Tensors are matched by canonical name (wrapper path components removed, docs/torchtitan-notes.md
§8) and moved shard by shard, so two models with the same parallel layout exchange weights without
communication. ``load_weights`` is the one entry point for a checkpoint directory: an HF safetensors
dir goes through torchtitan's state-dict adapter and DCP's HF reader (each rank reads only its shards,
docs/torchtitan-notes.md §15), anything else is a refexp/DCP checkpoint.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import warnings
from collections import Counter, defaultdict
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor import empty as dtensor_empty
from torch.distributed.tensor.placement_types import _StridedShard  # FSDP2's row sharding over TP
from torchtitan.models.common import FusedQKVLinear

from refexp.config import ConfigError, ModelConfig
from refexp.titan.build import _decoder
from refexp.titan.logprobs import _full_vocab
from refexp.titan.spec import _arch_from_model_config, _Arch, _family


# Wrappers that insert a path component into parameter names (docs/torchtitan-notes.md §8):
# activation checkpointing, torch.compile(model), FSDP1/DDP.
_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def _canonical_name(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def _reshard_fsdp(model: nn.Module) -> None:
    """Put FSDP's sharded parameters back on the modules (local, no communication).

    After a forward without backward (or with ``fsdp_reshard_after_forward=never``) FSDP leaves
    full-weight copies registered; writing into those would be lost at the next reshard.
    """
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def _named_state(model: nn.Module, *, buffers: bool = True) -> dict[str, torch.Tensor]:
    """Parameters (tied ones once) and buffers by canonical name, in their sharded form."""
    _reshard_fsdp(model)
    state = {_canonical_name(n): p for n, p in model.named_parameters()}
    if buffers:
        state.update({_canonical_name(n): b for n, b in model.named_buffers()})
    return state


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _layout(t: torch.Tensor) -> tuple:
    if isinstance(t, DTensor):
        return ("DTensor", tuple(t.shape), tuple(t.placements), t.device_mesh.mesh_dim_names)
    return ("Tensor", tuple(t.shape))


def _paired_state(dst: nn.Module, src: nn.Module) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, dst tensor, src tensor) for every parameter and buffer; AssertionError if the two models
    do not have the same names and parallel layout."""
    d, s = _named_state(dst), _named_state(src)
    assert d.keys() == s.keys(), (
        f"models differ in parameters: only in dst {sorted(d.keys() - s.keys())[:5]}, "
        f"only in src {sorted(s.keys() - d.keys())[:5]}"
    )
    for name in d:
        assert _layout(d[name]) == _layout(s[name]), (
            f"{name}: dst {_layout(d[name])} vs src {_layout(s[name])}; both models need the same "
            f"architecture and parallelism layout (build them with the same mesh and parallelism)"
        )
    return [(name, d[name], s[name]) for name in d]


@torch.no_grad()
def lerp_weights_(dst: nn.Module, src: nn.Module, alpha: float) -> None:
    """``dst <- alpha * src + (1 - alpha) * dst`` in place on every rank's local shards; buffers copied.

    alpha=1 is an exact copy (a hard reset), 0 < alpha < 1 an EMA step (TR-DPO's soft update).
    No communication: both models must have the same parallelism layout (asserted).
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha={alpha} is invalid: expected a number in [0, 1]")
    params = {_canonical_name(n) for n, _ in dst.named_parameters()}
    for name, d, s in _paired_state(dst, src):
        d_local, s_local = _local(d), _local(s)
        if alpha == 1.0 or name not in params:
            d_local.copy_(s_local)
        else:
            d_local.lerp_(s_local.to(d_local.dtype), alpha)


def count_parameters(model: nn.Module, *, local: bool = True) -> int:
    """Number of parameters (tied ones once): this rank's shards (``local``) or the whole model."""
    return sum((_local(p) if local else p).numel() for p in _named_state(model, buffers=False).values())


@torch.no_grad()
def save_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """An in-memory snapshot (detached clones) of parameters and buffers by canonical name, in the
    model's own layout (DTensor shards stay shards, no communication). Not a file format: use
    ``save_model_weights`` (DCP) for files, ``export_hf`` for HF safetensors."""
    return {name: t.detach().clone() for name, t in _named_state(model).items()}


@torch.no_grad()
def load_model_state_(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy a ``save_model_state`` snapshot back into ``model`` (same names and layout, asserted)."""
    mine = _named_state(model)
    assert mine.keys() == state.keys(), (
        f"snapshot does not match the model: missing {sorted(mine.keys() - state.keys())[:5]}, "
        f"unexpected {sorted(state.keys() - mine.keys())[:5]}"
    )
    for name, t in mine.items():
        assert _layout(t) == _layout(state[name]), f"{name}: model {_layout(t)} vs snapshot {_layout(state[name])}"
        _local(t).copy_(_local(state[name]))


def _state_dict_adapter(model: nn.Module, model_cfg: ModelConfig):
    spec = _family(model_cfg.name).registry.model_registry(model_cfg.flavor)
    # hf_assets_path=None: the adapter only uses it to look for a safetensors index when *saving*
    # sharded HF files, and warns when there is none.
    return spec.state_dict_adapter(_decoder(model).config, None)


def _fused_qkv_modules(model: nn.Module) -> dict[str, FusedQKVLinear]:
    """Canonical prefix (``layers.0.attention.qkv_linear.``) -> fused Q/K/V projection."""
    return {_canonical_name(n) + ".": m for n, m in _decoder(model).named_modules() if isinstance(m, FusedQKVLinear)}


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
    for size, p in zip(wqkv.device_mesh.shape, wqkv.placements):
        if size == 1 or isinstance(p, Replicate):
            continue
        if not (isinstance(p, (Shard, _StridedShard)) and p.dim == 0):
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


def _native_load_targets(model: nn.Module) -> dict[str, torch.Tensor]:
    """Where each native (unfused ``wq``/``wk``/``wv``) tensor is read into, by canonical name.

    A parameter is its own target (DCP reads this rank's shard straight into it, tied weights
    under each name); a fused ``wqkv`` gets three fresh targets, fused by ``_fuse_qkv_``.
    """
    _reshard_fsdp(model)
    fused = _fused_qkv_modules(model)
    targets = {}
    for name, param in _decoder(model).named_parameters(remove_duplicate=False):
        name = _canonical_name(name)
        prefix = name.removesuffix("wqkv.weight")
        if name.endswith("wqkv.weight") and prefix in fused:
            module = fused[prefix]
            local = _merges_locally(param, _n_kv_groups(module))
            for w, shape in _qkv_shapes(module).items():
                targets[f"{prefix}{w}.weight"] = _empty_like_layout(param, shape, local=local)
        else:
            targets[name] = param
    return targets


def _fuse_qkv_(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy the loaded ``wq``/``wk``/``wv`` of each fused projection into its ``wqkv`` shard.

    FusedQKVLinear's own load hook does the fusing, on this rank's shards when they are whole KV
    groups (``_merges_locally``; no communication), else on full tensors cut to the shard.
    """
    for prefix, module in _fused_qkv_modules(model).items():
        param = module.wqkv.weight
        local = _merges_locally(param, _n_kv_groups(module))
        parts = {f"{prefix}{w}.weight": _local(state.pop(f"{prefix}{w}.weight")) for w in ("wq", "wk", "wv")}
        FusedQKVLinear._merge_qkv_on_load(module, parts, prefix)
        fused = parts[f"{prefix}wqkv.weight"]
        if isinstance(param, DTensor) and not local:  # full tensors were read: keep this rank's shard
            fused = distribute_tensor(fused, param.device_mesh, param.placements, src_data_rank=None).to_local()
        _local(param).copy_(fused)


def _check_hf_keys(hf_dir: str, reader, hf_targets: dict[str, torch.Tensor]) -> None:
    """KeyError / ValueError naming what the checkpoint lacks or has in another shape (only the
    safetensors headers are read)."""
    stored = reader.read_metadata().state_dict_metadata
    missing = sorted(hf_targets.keys() - stored.keys())
    if missing:
        raise KeyError(f"{hf_dir}: no weights for {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    for name, t in hf_targets.items():
        if tuple(stored[name].size) != tuple(t.shape):
            raise ValueError(f"{hf_dir}: {name} has shape {tuple(stored[name].size)}, "
                             f"the model expects {tuple(t.shape)}")


@torch.no_grad()
def load_hf_weights_(model: nn.Module, model_cfg: ModelConfig, hf_dir: str) -> None:
    """Load an HF safetensors checkpoint (one file or an indexed set) into a (possibly sharded) model in place.

    torchtitan's checkpointer path (``dcp_load`` with ``from_hf``): the adapter's ``to_hf`` names the
    targets, DCP's ``HuggingFaceStorageReader`` reads each rank's rows only (safetensors slices,
    straight into the parameter shards), ``from_hf`` maps back (and un-permutes llama's Q/K for RoPE).
    Collective under FSDP/TP: every rank calls it. Works without a process group too
    (docs/torchtitan-notes.md §15).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    adapter = _state_dict_adapter(model, model_cfg)
    hf_targets = adapter.to_hf(_native_load_targets(model))
    reader = HuggingFaceStorageReader(hf_dir)
    _check_hf_keys(hf_dir, reader, hf_targets)
    with warnings.catch_warnings():  # DCP warns that it runs without a process group: intended here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(hf_targets, storage_reader=reader, no_dist=not dist.is_initialized())
    state = adapter.from_hf(hf_targets)
    _fuse_qkv_(model, state)
    for name, param in _decoder(model).named_parameters():
        new = state.get(_canonical_name(name))
        if new is not None and new is not param:  # from_hf made a new tensor: copy it into the shard
            _local(param).copy_(_local(new))


def _hf_config_dict(name: str, a: _Arch, dtype: torch.dtype) -> dict:
    """An HF config.json for ``a`` readable by transformers 4 (rope_theta/rope_scaling) and 5."""
    family = _family(name)
    rope = a.rope
    rope_scaling = None
    max_positions = a.max_seq_len
    if getattr(rope, "scaling", "none") == "llama":
        # transformers warns when the scaled rope's original length exceeds max_position_embeddings.
        max_positions = max(max_positions, rope.original_max_position_embeddings)
        rope_scaling = {
            "rope_type": "llama3", "factor": rope.scaling_factor, "low_freq_factor": rope.low_freq_factor,
            "high_freq_factor": rope.high_freq_factor,
            "original_max_position_embeddings": rope.original_max_position_embeddings,
        }
    config = {
        "architectures": [family.hf_architecture],
        "model_type": family.hf_model_type,
        "hidden_size": a.dim,
        "intermediate_size": a.ffn_hidden_dim,
        "num_hidden_layers": a.n_layers,
        "num_attention_heads": a.n_heads,
        "num_key_value_heads": a.n_kv_heads,
        "head_dim": a.head_dim,
        "vocab_size": a.vocab_size,
        "max_position_embeddings": max_positions,
        "rms_norm_eps": a.norm_eps,
        "tie_word_embeddings": a.tie_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
        "rope_theta": rope.theta,
        "rope_scaling": rope_scaling,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    if name == "llama3":
        config["mlp_bias"] = False
    else:
        config["use_sliding_window"] = False
    return config


_HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                       "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model")


# transformers' save_pretrained default: one file up to this size, an indexed set beyond it.
HF_MAX_SHARD_BYTES = 5 * 10**9


def _native_export_entries(model: nn.Module) -> list[tuple[str, torch.Tensor, FusedQKVLinear | None]]:
    """(canonical name, parameter, its fused Q/K/V module or None) for every tensor ``export_hf`` writes,
    in a fixed order (every rank gathers them in this order)."""
    _reshard_fsdp(model)
    fused = _fused_qkv_modules(model)
    entries = []
    for name, param in _decoder(model).named_parameters(remove_duplicate=False):
        name = _canonical_name(name)
        prefix = name.removesuffix("wqkv.weight")
        entries.append((name, param, fused.get(prefix) if name.endswith("wqkv.weight") else None))
    return entries


def _to_hf_one(adapter, name: str, full: torch.Tensor, module: FusedQKVLinear | None) -> dict[str, torch.Tensor]:
    """One native tensor (a full, plain tensor; meta for planning) as HF tensors: a fused ``wqkv`` is
    split by FusedQKVLinear's own save hook; the adapter renames (and permutes llama's Q/K).
    Empty when the adapter drops it (a tied ``lm_head``)."""
    state = {name: full}
    if module is not None:
        FusedQKVLinear._split_qkv_on_save(module, state, name.removesuffix("wqkv.weight"), None)
    return adapter.to_hf(state)


def _plan_hf_files(sizes: dict[str, int], max_shard_bytes: int) -> dict[str, str]:
    """HF tensor name -> file: ``model.safetensors`` when everything fits in ``max_shard_bytes``, else
    ``model-0000i-of-0000N.safetensors`` filled in order (save_pretrained's rule: a file takes
    tensors until the next would overflow it; a larger tensor gets a file of its own)."""
    files: list[list[str]] = [[]]
    used = 0
    for name, nbytes in sizes.items():
        if files[-1] and used + nbytes > max_shard_bytes:
            files.append([])
            used = 0
        files[-1].append(name)
        used += nbytes
    if len(files) == 1:
        return dict.fromkeys(files[0], "model.safetensors")
    n = len(files)
    return {name: f"model-{i:05d}-of-{n:05d}.safetensors" for i, names in enumerate(files, 1) for name in names}


def _clear_hf_weights(out_dir: str) -> None:
    """Remove an earlier export's weight files, so a reader never mixes two exports."""
    for path in glob.glob(os.path.join(out_dir, "model*.safetensors")) + glob.glob(
            os.path.join(out_dir, "model.safetensors.index.json")):
        os.remove(path)


def _write_hf_index(out_dir: str, weight_map: dict[str, str], total_size: int) -> None:
    """transformers' ``model.safetensors.index.json`` for a multi-file export."""
    index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)


@torch.no_grad()
def _write_hf_weights(model: nn.Module, model_cfg: ModelConfig, out_dir: str, max_shard_bytes: int) -> torch.dtype:
    """Gather the model tensor by tensor (a collective per sharded tensor) and write the HF safetensors
    from rank 0, each file as soon as its tensors are in: rank 0 holds at most one file's tensors.
    Returns the weights' dtype."""
    from safetensors.torch import save_file

    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    adapter = _state_dict_adapter(model, model_cfg)
    entries = _native_export_entries(model)
    # Plan on meta tensors (names and sizes only): the files are fixed before any data moves.
    planned = [_to_hf_one(adapter, name, torch.empty(p.shape, dtype=p.dtype, device="meta"), module)
               for name, p, module in entries]
    sizes = {k: v.numel() * v.element_size() for hf in planned for k, v in hf.items()}
    file_of = _plan_hf_files(sizes, max_shard_bytes)
    remaining = Counter(file_of.values())  # tensors each file still waits for
    if rank0:
        os.makedirs(out_dir, exist_ok=True)
        _clear_hf_weights(out_dir)
    buffers: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
    for (name, param, module), hf in zip(entries, planned):
        if not hf:  # dropped by the adapter (a tied lm_head): nothing to gather
            continue
        full = _full_vocab(param)  # full_tensor() on every rank: a collective per sharded tensor
        if not rank0:
            continue
        for k, v in _to_hf_one(adapter, name, full.detach().to("cpu"), module).items():
            f = file_of[k]
            buffers[f][k] = v.contiguous().clone()
            remaining[f] -= 1
            if remaining[f] == 0:
                save_file(buffers.pop(f), os.path.join(out_dir, f), metadata={"format": "pt"})
    if rank0 and len(remaining) > 1:
        _write_hf_index(out_dir, file_of, sum(sizes.values()))
    return next(p.dtype for _, p, _ in entries)


def export_hf(model: nn.Module, model_cfg: ModelConfig, out_dir: str, *, tokenizer=None,
              max_shard_bytes: int = HF_MAX_SHARD_BYTES) -> None:
    """Write ``model`` as an HF checkpoint that ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained``
    load and ``generate`` runs on: the weights, config.json, the tokenizer files and generation_config.json.

    The weights are one ``model.safetensors`` when they fit in ``max_shard_bytes``, else
    ``model-0000i-of-0000N.safetensors`` files with transformers' ``model.safetensors.index.json``.
    Collective: call on every rank; sharded tensors are gathered one at a time and rank 0 writes.
    The tokenizer files come from ``tokenizer`` (a ``refexp.tasks.TextTokenizer``: what the run
    tokenized with, chat template included) when given, else are copied from ``model.hf_assets_path``.
    generation_config.json is copied from ``model.hf_assets_path`` (its sampling defaults and every eos
    id), else written from ``tokenizer``'s eos/pad/bos ids.
    """
    if max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes={max_shard_bytes} is invalid: expected a positive number of bytes")
    dtype = _write_hf_weights(model, model_cfg, out_dir, max_shard_bytes)
    if not dist.is_initialized() or dist.get_rank() == 0:
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            config = _hf_config_dict(model_cfg.name, _arch_from_model_config(_decoder(model).config), dtype)
            json.dump(config, f, indent=2)
        _export_sidecars(model_cfg.hf_assets_path, out_dir, tokenizer)
    if dist.is_initialized():
        dist.barrier()


def _export_sidecars(src: str | None, out_dir: str, tokenizer) -> None:
    """The tokenizer files and generation_config.json of an export (see ``export_hf``)."""
    if tokenizer is not None:
        tokenizer.save(out_dir)
    else:
        for fname in _HF_TOKENIZER_FILES:
            if src and os.path.isfile(os.path.join(src, fname)):
                shutil.copy(os.path.join(src, fname), os.path.join(out_dir, fname))
    if src and os.path.isfile(os.path.join(src, "generation_config.json")):
        shutil.copy(os.path.join(src, "generation_config.json"), os.path.join(out_dir, "generation_config.json"))
    elif tokenizer is not None:
        from transformers import GenerationConfig

        GenerationConfig(**tokenizer.generation_ids()).save_pretrained(out_dir)


# --------------------------------------------------------------------------- checkpoint directories


def latest_checkpoint_step(folder: str | os.PathLike) -> int:
    """Highest ``step-N`` under folder whose DCP metadata was written (-1 if none)."""
    folder = Path(folder)
    if not folder.is_dir():
        return -1
    steps = [int(m.group(1)) for p in folder.iterdir()
             if (m := re.fullmatch(r"step-(\d+)", p.name)) and (p / ".metadata").is_file()]
    return max(steps, default=-1)


def is_hf_dir(path: str | os.PathLike) -> bool:
    """An HF checkpoint dir: config.json beside safetensors weights."""
    p = Path(path)
    return (p / "config.json").is_file() and any(p.glob("*.safetensors"))


def save_model_weights(model: torch.nn.Module, checkpoint_dir: str | os.PathLike) -> None:
    """Model-only DCP checkpoint (reshardable: loads into any parallelism)."""
    import torch.distributed.checkpoint as dcp

    dcp.save(model.state_dict(), checkpoint_id=str(checkpoint_dir))


def load_model_weights(model: torch.nn.Module, checkpoint_dir: str | os.PathLike) -> None:
    """Load model weights from a refexp model-only checkpoint, a run's ``checkpoint/step-N``, or a run dir."""
    import torch.distributed.checkpoint as dcp

    path = Path(checkpoint_dir)
    if not path.is_dir():
        raise ConfigError(f"checkpoint directory {str(path)!r} does not exist")
    if (path / "model").is_dir() and (path / "model" / ".metadata").is_file():
        path = path / "model"  # a refexp SFT output dir
    elif not (path / ".metadata").is_file():
        step = latest_checkpoint_step(path / "checkpoint") if (path / "checkpoint").is_dir() else -1
        if step >= 0:
            path = path / "checkpoint" / f"step-{step}"
        else:
            raise ConfigError(
                f"{str(checkpoint_dir)!r} holds no DCP checkpoint (.metadata) — expected a refexp SFT output, "
                f"a run's checkpoint/step-N, or a run dir with checkpoint/"
            )
    sd = model.state_dict()
    dcp.load(sd, checkpoint_id=str(path))
    model.load_state_dict(sd)


def load_weights(model: nn.Module, model_cfg: ModelConfig, path: str | os.PathLike, *,
                 hf: bool | None = None) -> None:
    """Load the weights in ``path`` into ``model`` in place: the one entry point for a weights directory.

    ``hf=True``: an HF safetensors dir (``load_hf_weights_``); ``hf=False``: a refexp/DCP checkpoint
    (``load_model_weights``: an SFT output, a run's ``checkpoint/step-N``, or a run dir);
    ``hf=None``: decided by ``is_hf_dir(path)`` (config.json beside ``*.safetensors``).
    """
    if hf is None:
        hf = is_hf_dir(path)
    if hf:
        load_hf_weights_(model, model_cfg, str(path))
    else:
        load_model_weights(model, path)
