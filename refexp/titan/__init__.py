"""refexp's only door into torchtitan 0.3.0: build, parallelize, load/export HF weights, log-probs,
weight averaging and KV-cache decoding of llama3 / dense qwen3 models.

Everything torchtitan-specific lives in this package so that a torchtitan release that moves its
config layer again (0.2 -> 0.3 replaced the whole TOML JobConfig) touches only these files. Other
modules see plain ``torch.nn.Module`` objects and the functions re-exported below.

Modules:
  cpu_compat  the EP-kernel stand-in (installed first, on import), device re-pointing, ``resolve_device``
  attention   ``MaskedSDPA`` (dense masks, ``CausalRows``) and the swap of flex attention for SDPA
  spec        families, flavors, ``model.*`` overrides, HF config.json -> ``build_model_spec``
  build       parallel dims, weight init, TP/FSDP parallelize, compile -> ``build_model``
  logprobs    forward, full ``logits``, vocab-parallel ``token_logprobs``
  weights     name canonicalisation, copy/EMA, snapshots, DCP and HF checkpoints in and out, ``load_weights``
  kv_cache    the decode state: KV-cache buffers and the write of a step's keys/values
  decode      KV-cache decoding: ``prefill``, ``decode_step``, ``repeat_decode_rows``, ``finish_decode``
  decode_step_plain  the one-token step on plain weights and its fixed-shape (CUDA-graph) form
  components  torchtitan's optimizer/LR-schedule containers and ``CheckpointManager``

CPU workarounds (docs/torchtitan-notes.md §n):
  §1 a stand-in for ``torchtitan.distributed.minimal_async_ep.kernels`` when ``triton`` is missing (cpu_compat),
  §2 torchtitan's module-level ``device_type`` copies re-pointed to "cpu" (cpu_compat),
  §3 SDPA instead of flex attention (``model.attn_backend=sdpa``): no flex backward on CPU (attention),
  §4 ``spmd_backend=partial_dtensor`` (the default ``spmd_types`` fails with FSDP/TP) (build),
  §5 ``set_force_sum_reduction_for_comms(True)`` on every FSDP module (gloo has no PREMUL_SUM) (build),
  §6 float32 parameters on CPU,
  §8 parameter names mapped through activation-checkpoint / compile wrappers (weights).

Departures from torchtitan's own trainer:
  - The model config is rebuilt from the flavor's hyper-parameters (``_Arch``) with refexp's
    overrides (``model.dim`` ...) or an HF ``config.json``, through the family's own layer builders,
    so a shrunk flavor is initialised exactly like torchtitan initialises that shape (spec).
  - Weights are initialised on the full (unsharded) model before parallelizing, so the weights do
    not depend on the world size. This materialises the whole model on every rank once; fine for the
    model sizes refexp studies, not for 70B (build).
  - Tied embeddings (qwen3 <= 4B, llama3 1B/3B) are re-tied right after TP and before FSDP: TP gives
    ``tok_embeddings`` and ``lm_head`` separate DTensor copies, which torchtitan only re-ties in
    ``init_states`` (after FSDP), and refexp initialises before parallelizing (build).
  - Gradient reduction follows torchtitan: FSDP's divide factor is 1 (a SUM over data-parallel
    ranks), so a training loss must be normalised by the *global* token count (§5).
  - Decoding keeps its own KV cache built from the decoder's sub-modules (``prefill``/``decode_step``);
    under TP each rank caches its own attention heads (§14) (decode).
  - HF weights load through DCP's ``HuggingFaceStorageReader``, so each rank reads only its shards (§15), and
    export as transformers' indexed file set beyond ``max_shard_bytes`` (weights).
"""

# First: installs the EP-kernel stand-in before any module below imports torchtitan (§1).
from refexp.titan import cpu_compat  # noqa: F401
from refexp.titan.attention import CausalRows, MaskedSDPA
from refexp.titan.build import build_model, make_parallel_dims
from refexp.titan.cpu_compat import prepare_torchtitan, resolve_device
from refexp.titan.decode import decode_step, finish_decode, prefill, repeat_decode_rows
from refexp.titan.kv_cache import DecodeState
from refexp.titan.logprobs import logits, token_logprobs
from refexp.titan.spec import build_model_spec, model_cfg_overrides_from_hf
from refexp.titan.weights import _canonical_name  # noqa: F401  (tests match gradients by canonical name)
from refexp.titan.weights import (
    count_parameters,
    export_hf,
    is_hf_dir,
    latest_checkpoint_step,
    lerp_weights_,
    load_hf_weights_,
    load_model_state_,
    load_model_weights,
    load_weights,
    save_model_state,
    save_model_weights,
)

__all__ = [
    "CausalRows",
    "DecodeState",
    "MaskedSDPA",
    "build_model",
    "build_model_spec",
    "count_parameters",
    "decode_step",
    "export_hf",
    "finish_decode",
    "is_hf_dir",
    "latest_checkpoint_step",
    "lerp_weights_",
    "load_hf_weights_",
    "load_model_state_",
    "load_model_weights",
    "load_weights",
    "logits",
    "make_parallel_dims",
    "model_cfg_overrides_from_hf",
    "prefill",
    "prepare_torchtitan",
    "repeat_decode_rows",
    "resolve_device",
    "save_model_state",
    "save_model_weights",
    "token_logprobs",
]
