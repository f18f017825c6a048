"""Weights in and out of a built model: copy/EMA between models, snapshots, DCP and HF checkpoints.

Tensors are matched by canonical name (wrapper path components removed, docs/torchtitan-notes.md
§8) and moved shard by shard, so two models with the same parallel layout exchange weights without
communication. ``load_weights`` is the one entry point for a checkpoint directory: an HF safetensors
dir goes through torchtitan's state-dict adapter, anything else is a refexp/DCP checkpoint.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor, distribute_tensor
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


def _read_safetensors(hf_dir: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(glob.glob(os.path.join(hf_dir, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {hf_dir}")
    state: dict[str, torch.Tensor] = {}
    for path in files:
        state.update(load_file(path))
    return state


def _state_dict_adapter(model: nn.Module, model_cfg: ModelConfig):
    spec = _family(model_cfg.name).registry.model_registry(model_cfg.flavor)
    # hf_assets_path=None: the adapter only uses it to look for a safetensors index when *saving*
    # sharded HF files, and warns when there is none.
    return spec.state_dict_adapter(_decoder(model).config, None)


@torch.no_grad()
def load_hf_weights_(model: nn.Module, model_cfg: ModelConfig, hf_dir: str) -> None:
    """Load an HF safetensors checkpoint into a (possibly sharded) model in place.

    The state-dict adapter's ``from_hf`` maps names (and un-permutes llama's Q/K for RoPE); every
    rank reads the files and keeps its own shard of each tensor, so no communication is needed.
    """
    adapter = _state_dict_adapter(model, model_cfg)
    state = adapter.from_hf(_read_safetensors(hf_dir))
    # The adapter speaks the unfused wq/wk/wv layout; fuse it the way FusedQKVLinear's own load hook does.
    for name, module in _decoder(model).named_modules():
        if isinstance(module, FusedQKVLinear):
            FusedQKVLinear._merge_qkv_on_load(module, state, _canonical_name(name) + ".")
    targets = {_canonical_name(n): p for n, p in _decoder(model).named_parameters(remove_duplicate=False)}
    missing = sorted(targets.keys() - state.keys())
    if missing:
        raise KeyError(f"{hf_dir}: no weights for {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    for name, param in targets.items():
        full = state[name]
        if tuple(full.shape) != tuple(param.shape):
            raise ValueError(f"{hf_dir}: {name} has shape {tuple(full.shape)}, the model expects {tuple(param.shape)}")
        full = full.to(device=_local(param).device, dtype=param.dtype)
        if isinstance(param, DTensor):
            full = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()
        _local(param).copy_(full)


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


def export_hf(model: nn.Module, model_cfg: ModelConfig, out_dir: str, *, tokenizer=None) -> None:
    """Write ``model`` as an HF checkpoint that ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained``
    load and ``generate`` runs on: model.safetensors, config.json, the tokenizer files and
    generation_config.json.

    Collective: call on every rank; sharded tensors are gathered one at a time and rank 0 writes.
    The tokenizer files come from ``tokenizer`` (a ``refexp.tasks.TextTokenizer``: what the run
    tokenized with, chat template included) when given, else are copied from ``model.hf_assets_path``.
    generation_config.json is copied from ``model.hf_assets_path`` (its sampling defaults and every eos
    id), else written from ``tokenizer``'s eos/pad/bos ids.
    """
    from safetensors.torch import save_file

    dec = _decoder(model)
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    full = {}
    with torch.no_grad():
        # state_dict() (not parameters) so FusedQKVLinear's save hook splits wqkv into wq/wk/wv.
        for name, t in dec.state_dict().items():
            t = _full_vocab(t)  # full_tensor() on every rank: a collective per sharded tensor
            if rank0:
                full[_canonical_name(name)] = t.detach().to("cpu")
    if rank0:
        adapter = _state_dict_adapter(model, model_cfg)
        hf_state = {k: v.contiguous().clone() for k, v in adapter.to_hf(full).items()}
        os.makedirs(out_dir, exist_ok=True)
        save_file(hf_state, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
        dtype = next(iter(hf_state.values())).dtype
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(_hf_config_dict(model_cfg.name, _arch_from_model_config(dec.config), dtype), f, indent=2)
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
