"""refexp's only door into torchtitan 0.3.0: build, parallelize, load/export HF weights, log-probs,
weight copies and KV-cache decoding of llama3 / dense qwen3 models. Other modules see plain
``torch.nn.Module`` objects and the functions re-exported below, so a torchtitan release that moves its
config layer touches only this package. The modules, the CPU workarounds (§n) and where refexp departs
from torchtitan's own trainer: docs/architecture.md and docs/torchtitan-notes.md.
"""

# First: the stand-ins for names an older torch lacks (§17) and the EP-kernel stand-in (§1), before any
# module below imports torchtitan.
from refexp.titan import torch_compat  # noqa: F401  # isort: skip
from refexp.titan import cpu_compat  # noqa: F401  # isort: skip
from refexp.titan.attention import CausalRows, MaskedSDPA
from refexp.titan.build import build_model, make_parallel_dims
from refexp.titan.checkpoint_dirs import (
    is_hf_dir,
    latest_checkpoint_step,
    load_model_weights,
    load_weights,
    save_model_weights,
)
from refexp.titan.copies import copy_shards_to_host, count_parameters, fp32_master, lerp_weights_, restore_shards_
from refexp.titan.cpu_compat import prepare_torchtitan, resolve_device
from refexp.titan.decode import compiles_next_step, decode_step, finish_decode, prefill, repeat_decode_rows
from refexp.titan.exact_kl import token_kl
from refexp.titan.hf_config import model_cfg_overrides_from_hf
from refexp.titan.hf_weights import export_hf, load_hf_weights_
from refexp.titan.kv_cache import DecodeState
from refexp.titan.logprobs import logits, token_logprobs
from refexp.titan.lora import (
    AdapterStates,
    LoRAView,
    delta_master,
    has_adapters,
    lora_targets,
    lora_view,
    update_reference_,
    viewed,
)
from refexp.titan.spec import build_model_spec
from refexp.titan.static_decode import release_static_buckets, static_decode_stats

__all__ = [
    "AdapterStates",
    "CausalRows",
    "DecodeState",
    "MaskedSDPA",
    "build_model",
    "build_model_spec",
    "compiles_next_step",
    "copy_shards_to_host",
    "count_parameters",
    "decode_step",
    "delta_master",
    "export_hf",
    "finish_decode",
    "fp32_master",
    "has_adapters",
    "is_hf_dir",
    "latest_checkpoint_step",
    "lerp_weights_",
    "load_hf_weights_",
    "load_model_weights",
    "load_weights",
    "logits",
    "lora_targets",
    "LoRAView",
    "lora_view",
    "viewed",
    "make_parallel_dims",
    "model_cfg_overrides_from_hf",
    "prefill",
    "prepare_torchtitan",
    "release_static_buckets",
    "repeat_decode_rows",
    "resolve_device",
    "restore_shards_",
    "save_model_weights",
    "static_decode_stats",
    "token_kl",
    "token_logprobs",
    "update_reference_",
]
