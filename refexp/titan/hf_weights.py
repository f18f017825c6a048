"""HF safetensors checkpoints in and out of a (possibly sharded) built model: ``load_hf_weights_``
reads each rank's shards through DCP's HF reader, ``export_hf`` writes transformers' layout
(weights, config.json, tokenizer files, generation_config.json) from rank 0 (docs/torchtitan-notes.md §15).
"""

from __future__ import annotations

import datetime
import glob
import json
import os
import shutil
import warnings
from collections import defaultdict

import torch
import torch.distributed as dist
import torch.nn as nn

from refexp.config import ModelConfig
from refexp.titan.families import arch_from_model_config
from refexp.titan.hf_config import write_hf_config
from refexp.titan.hf_tensors import (
    fuse_qkv_,
    native_export_entries,
    native_load_targets,
    state_dict_adapter,
    to_hf_tensors,
)
from refexp.titan.lora import adapted_modules, merged_full
from refexp.titan.unwrap import canonical_name, decoder_of, full_tensor, local_tensor

_HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                       "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model")

# transformers' save_pretrained default: one file up to this size, an indexed set beyond it.
HF_MAX_SHARD_BYTES = 5 * 10**9


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

    adapter = state_dict_adapter(model, model_cfg)
    hf_targets = adapter.to_hf(native_load_targets(model))
    reader = HuggingFaceStorageReader(hf_dir)
    _check_hf_keys(hf_dir, reader, hf_targets)
    with warnings.catch_warnings():  # DCP warns that it runs without a process group: intended here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(hf_targets, storage_reader=reader, no_dist=not dist.is_initialized())
    state = adapter.from_hf(hf_targets)
    fuse_qkv_(model, state)
    for name, param in decoder_of(model).named_parameters():
        new = state.get(canonical_name(name))
        if new is not None and new is not param:  # from_hf made a new tensor: copy it into the shard
            local_tensor(param).copy_(local_tensor(new))


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


EXPORT_WAIT_MIN_S = 1800.0
"""The shortest time the other ranks wait for rank 0's files (``export_hf``)."""
EXPORT_WRITE_BYTES_PER_S = 20e6
"""A slow shared filesystem's write rate: the wait grows past ``EXPORT_WAIT_MIN_S`` for exports larger than
36 GB at it."""


@torch.no_grad()
def _write_hf_weights(model: nn.Module, model_cfg: ModelConfig, out_dir: str, max_shard_bytes: int) -> torch.dtype:
    """Gather the model tensor by tensor (a collective per sharded tensor) into rank 0's host memory, then
    write the HF safetensors from rank 0 with no collective left: a file written while the other ranks wait
    inside a gather would hold them there past the collective timeout on a slow filesystem. Rank 0 holds
    the whole model in host memory meanwhile (an 8B model in bf16: 16 GB). Returns the weights' dtype."""
    from safetensors.torch import save_file

    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    adapter = state_dict_adapter(model, model_cfg)
    entries = native_export_entries(model)
    # Plan on meta tensors (names and sizes only): the files are fixed before any data moves.
    planned = [to_hf_tensors(adapter, name, torch.empty(p.shape, dtype=p.dtype, device="meta"), module)
               for name, p, module in entries]
    sizes = {k: v.numel() * v.element_size() for hf in planned for k, v in hf.items()}
    file_of = _plan_hf_files(sizes, max_shard_bytes)
    buffers: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
    adapted = {f"{name}.weight": m for name, m in adapted_modules(decoder_of(model)).items()}  # LoRA: merged
    for (name, param, module), hf in zip(entries, planned):
        if not hf:  # dropped by the adapter (a tied lm_head): nothing to gather
            continue
        full = full_tensor(param)  # full_tensor() on every rank: a collective per sharded tensor
        if name in adapted:
            full = merged_full(adapted[name], full)  # W + scale * B A (gathers A and B on every rank)
        if not rank0:
            continue
        for k, v in to_hf_tensors(adapter, name, full.detach().to("cpu"), module).items():
            buffers[file_of[k]][k] = v.contiguous().clone()
    if rank0:  # every collective is done: rank 0 writes alone
        os.makedirs(out_dir, exist_ok=True)
        _clear_hf_weights(out_dir)
        for file in sorted(buffers):
            save_file(buffers.pop(file), os.path.join(out_dir, file), metadata={"format": "pt"})
        if len(set(file_of.values())) > 1:
            _write_hf_index(out_dir, file_of, sum(sizes.values()))
    return next(p.dtype for _, p, _ in entries)


def _waiting_group(nbytes: int):
    """A gloo group whose barrier the other ranks wait at while rank 0 writes ``nbytes`` of files: its
    timeout is long enough for a slow filesystem (``EXPORT_WAIT_MIN_S``, ``EXPORT_WRITE_BYTES_PER_S``), and a
    CPU barrier leaves nothing pending on the GPU's collective watchdog. None on one process."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    wait_s = max(EXPORT_WAIT_MIN_S, nbytes / EXPORT_WRITE_BYTES_PER_S)
    return dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=wait_s))


def export_hf(model: nn.Module, model_cfg: ModelConfig, out_dir: str, *, tokenizer=None,
              max_shard_bytes: int = HF_MAX_SHARD_BYTES) -> None:
    """Write ``model`` as an HF checkpoint that ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained``
    load and ``generate`` runs on: the weights, config.json, the tokenizer files and generation_config.json.

    The weights are one ``model.safetensors`` when they fit in ``max_shard_bytes``, else
    ``model-0000i-of-0000N.safetensors`` files with transformers' ``model.safetensors.index.json``.
    A LoRA policy is written merged: each adapted weight as ``W + scale * B A`` (``titan/lora.py``), no adapters.
    Collective: call on every rank; sharded tensors are gathered one at a time into rank 0's host memory,
    then rank 0 writes every file while the other ranks wait at a barrier of their own, with no collective
    in flight (``_write_hf_weights``, ``_waiting_group``).
    The tokenizer files come from ``tokenizer`` (a ``refexp.tasks.TextTokenizer``: what the run
    tokenized with, chat template included) when given, else are copied from ``model.hf_assets_path``.
    generation_config.json is copied from ``model.hf_assets_path`` (its sampling defaults and every eos
    id), else written from ``tokenizer``'s eos/pad/bos ids.
    """
    if max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes={max_shard_bytes} is invalid: expected a positive number of bytes")
    nbytes = sum(p.numel() * p.element_size() for _, p, _ in native_export_entries(model))
    waiting = _waiting_group(nbytes)  # made by every rank before rank 0 starts writing
    dtype = _write_hf_weights(model, model_cfg, out_dir, max_shard_bytes)
    if not dist.is_initialized() or dist.get_rank() == 0:
        write_hf_config(out_dir, model_cfg.name, arch_from_model_config(decoder_of(model).config), dtype)
        _export_sidecars(model_cfg.hf_assets_path, out_dir, tokenizer)
    if waiting is not None:
        dist.barrier(group=waiting)
        dist.destroy_process_group(waiting)


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
