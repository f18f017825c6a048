"""refexp's only door into torchtitan 0.3.0: build, parallelize, load/export HF weights, log-probs,
weight averaging and KV-cache decoding of llama3 / dense qwen3 models.

Everything torchtitan-specific lives here so that a torchtitan release that moves its config layer
again (0.2 -> 0.3 replaced the whole TOML JobConfig) touches one file. Other modules see plain
``torch.nn.Module`` objects and the functions below.

CPU workarounds (``/work/shared/NOTES-torchtitan-cpu.md``, cited as NOTES #n):
  #1 a stand-in for ``torchtitan.distributed.minimal_async_ep.kernels`` when ``triton`` is missing,
  #2 torchtitan's module-level ``device_type`` copies re-pointed to "cpu",
  #3 SDPA instead of flex attention (``model.attn_backend=sdpa``): no flex backward on CPU,
  #4 ``spmd_backend=partial_dtensor`` (the default ``spmd_types`` fails with FSDP/TP),
  #5 ``set_force_sum_reduction_for_comms(True)`` on every FSDP module (gloo has no PREMUL_SUM),
  #6 float32 parameters on CPU,
  #8 parameter names mapped through activation-checkpoint / compile wrappers.

Departures from torchtitan's own trainer:
  - The model config is rebuilt from the flavor's hyper-parameters (``_Arch``) with refexp's
    overrides (``model.dim`` ...) or an HF ``config.json``, through the family's own layer builders,
    so a shrunk flavor is initialised exactly like torchtitan initialises that shape.
  - Weights are initialised on the full (unsharded) model before parallelizing, so the weights do
    not depend on the world size. This materialises the whole model on every rank once; fine for the
    model sizes refexp studies, not for 70B.
  - Tied embeddings (qwen3 <= 4B, llama3 1B/3B) are re-tied right after TP and before FSDP: TP gives
    ``tok_embeddings`` and ``lm_head`` separate DTensor copies, which torchtitan only re-ties in
    ``init_states`` (after FSDP), and refexp initialises before parallelizing.
  - Gradient reduction follows torchtitan: FSDP's divide factor is 1 (a SUM over data-parallel
    ranks), so a training loss must be normalised by the *global* token count (NOTES #5).
  - Decoding keeps its own KV cache built from the decoder's sub-modules (``prefill``/``decode_step``);
    under TP it re-runs the whole model every step instead.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import json
import os
import shutil
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.nn.attention import sdpa_kernel

from refexp.config import CompileConfig, ConfigError, ModelConfig, ParallelismConfig, TrainingConfig

# --------------------------------------------------------------------------- CPU workarounds

# Names that torchtitan.distributed.minimal_async_ep.api imports from its triton kernels module.
_EP_KERNEL_NAMES = (
    "copy_full_counts_to_peers_kernel",
    "copy_rows_to_peers_kernel",
    "expand_topk_grad_kernel",
    "fill_combine_metadata_kernel",
    "fill_dispatch_metadata_kernel",
    "invert_flat_indices_kernel",
    "reduce_topk_slots_kernel",
    "topk_scores_grad_kernel",
)
_EP_KERNELS_MODULE = "torchtitan.distributed.minimal_async_ep.kernels"


def _install_ep_kernel_standin() -> None:
    """Let ``import torchtitan.models.common`` work without triton (NOTES #1).

    Only the expert-parallel kernels module needs triton; it is replaced by a module whose functions
    raise if called. ``triton`` itself is not stubbed: inductor probes for it.
    """
    if _EP_KERNELS_MODULE in sys.modules or importlib.util.find_spec("triton") is not None:
        return
    standin = types.ModuleType(_EP_KERNELS_MODULE)
    standin.__doc__ = "refexp stand-in: MinimalAsyncEP kernels need triton, which is not installed."

    def _needs_triton(*args, **kwargs):
        raise RuntimeError("MinimalAsyncEP kernels need triton (refexp installed a stand-in; NOTES #1)")

    for name in _EP_KERNEL_NAMES:
        setattr(standin, name, _needs_triton)
    sys.modules[_EP_KERNELS_MODULE] = standin


_install_ep_kernel_standin()  # before the first torchtitan import below

from torchtitan.config import CompileConfig as TTCompileConfig  # noqa: E402
from torchtitan.config import ParallelismConfig as TTParallelismConfig  # noqa: E402
from torchtitan.config import TrainingConfig as TTTrainingConfig  # noqa: E402
from torchtitan.distributed import ParallelDims  # noqa: E402
from torchtitan.distributed import utils as tt_dist_utils  # noqa: E402
from torchtitan.distributed.compile import apply_compile  # noqa: E402
from torchtitan.models import llama3 as tt_llama3  # noqa: E402
from torchtitan.models import qwen3 as tt_qwen3  # noqa: E402
from torchtitan.models.common import (  # noqa: E402
    ComplexRoPE,
    CosSinRoPE,
    Embedding,
    FlexAttention,
    FusedQKVLinear,
    Linear,
    RMSNorm,
    ScaledDotProductAttention,
    VarlenAttention,
)
from torchtitan.models.llama3.sharding import set_llama3_sharding_config  # noqa: E402
from torchtitan.models.qwen3.sharding import set_qwen3_sharding_config  # noqa: E402
from torchtitan.protocols.model_spec import ModelSpec  # noqa: E402

# torchtitan modules that copy ``torchtitan.tools.utils.device_type`` at import time (NOTES #2).
_DEVICE_TYPE_MODULES = (
    "torchtitan.tools.utils",
    "torchtitan.distributed.parallel_dims",
    "torchtitan.distributed.utils",
    "torchtitan.models.common.token_dispatcher",
    "torchtitan.components.metrics",
)


def resolve_device(device: str) -> torch.device:
    """``auto`` | ``cpu`` | ``cuda`` -> a torch.device (``cuda:$LOCAL_RANK`` under torchrun)."""
    if device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"training.device={device!r} is invalid: expected one of auto, cpu, cuda")
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("training.device='cuda' is invalid: no CUDA device is visible (use auto or cpu)")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def prepare_torchtitan(device_type: str) -> None:
    """Apply the process-wide CPU workarounds; idempotent, cheap, safe to call before every build.

    Re-points torchtitan's module-level ``device_type``/``device_module`` copies to ``device_type``
    (they default to "cuda" on a machine without GPUs, NOTES #2) in every such module imported so
    far, so call it again after importing more of torchtitan.
    """
    _install_ep_kernel_standin()
    device_module = torch.cpu if device_type == "cpu" else getattr(torch, device_type)
    for name in _DEVICE_TYPE_MODULES:
        module = sys.modules.get(name)
        if module is None:
            continue
        if hasattr(module, "device_type"):
            module.device_type = device_type
        if hasattr(module, "device_module"):
            module.device_module = device_module


# --------------------------------------------------------------------------- model configs


@dataclass(frozen=True)
class _Arch:
    """The hyper-parameters that decide a dense decoder's shapes and numerics."""

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_hidden_dim: int
    vocab_size: int
    rope: Any  # a torchtitan RoPE.Config (ComplexRoPE for llama3, CosSinRoPE for qwen3)
    norm_eps: float
    tie_embeddings: bool
    fuse_qkv: bool = True

    @property
    def max_seq_len(self) -> int:
        return self.rope.max_seq_len


def _build_llama3_config(a: _Arch):
    """Llama3Model.Config for ``a`` through torchtitan's own llama3 layer builder and inits."""
    L = tt_llama3
    return L.Llama3Model.Config(
        dim=a.dim,
        vocab_size=a.vocab_size,
        enable_weight_tying=a.tie_embeddings,
        tok_embeddings=Embedding.Config(
            num_embeddings=a.vocab_size,
            embedding_dim=a.dim,
            param_init=L._EMBEDDING_SKIP_INIT if a.tie_embeddings else L._EMBEDDING_INIT,
        ),
        norm=RMSNorm.Config(normalized_shape=a.dim, eps=a.norm_eps, param_init=L._NORM_INIT),
        lm_head=Linear.Config(in_features=a.dim, out_features=a.vocab_size, param_init=L._output_linear_init(a.dim)),
        layers=L._build_llama3_layers(
            n_layers=a.n_layers,
            dim=a.dim,
            n_heads=a.n_heads,
            n_kv_heads=a.n_kv_heads,
            hidden_dim=a.ffn_hidden_dim,
            rope=a.rope,
            fuse_qkv=a.fuse_qkv,
            attn_backend="flex",  # swapped by _set_attention_backend; the builder refuses "sdpa"
        ),
    )


def _build_qwen3_config(a: _Arch):
    """Qwen3Model.Config (dense) for ``a`` through torchtitan's own qwen3 layer builder and inits."""
    Q = tt_qwen3
    return Q.Qwen3Model.Config(
        dim=a.dim,
        vocab_size=a.vocab_size,
        enable_weight_tying=a.tie_embeddings,
        tok_embeddings=Embedding.Config(
            num_embeddings=a.vocab_size,
            embedding_dim=a.dim,
            param_init=Q._EMBEDDING_SKIP_INIT if a.tie_embeddings else Q._EMBEDDING_INIT,
        ),
        norm=RMSNorm.Config(normalized_shape=a.dim, eps=a.norm_eps, param_init=Q._NORM_INIT),
        lm_head=Linear.Config(in_features=a.dim, out_features=a.vocab_size, param_init=Q._LINEAR_INIT),
        layers=Q._build_qwen3_layers(
            n_layers=a.n_layers,
            dim=a.dim,
            n_heads=a.n_heads,
            n_kv_heads=a.n_kv_heads,
            head_dim=a.head_dim,
            hidden_dim=a.ffn_hidden_dim,
            rope=a.rope,
            fuse_qkv=a.fuse_qkv,
            attn_backend="flex",
        ),
    )


@dataclass(frozen=True)
class _Family:
    registry: Any  # torchtitan.models.<name> package
    flavors: dict
    rope_cls: type
    hf_model_type: str
    hf_architecture: str
    build_config: Any
    set_sharding: Any


# torchtitan 0.3.0 keeps the per-shape builders and inits private (``_build_llama3_layers``,
# ``_LINEAR_INIT``, ...); they are used here so that a shrunk flavor is built and initialised exactly
# like torchtitan builds that flavor. If they move, this table and the two builders above are the
# only places to change.
_FAMILIES = {
    "llama3": _Family(
        registry=tt_llama3,
        flavors=tt_llama3.llama3_configs,
        rope_cls=ComplexRoPE,
        hf_model_type="llama",
        hf_architecture="LlamaForCausalLM",
        build_config=_build_llama3_config,
        set_sharding=lambda cfg, enable_sp: set_llama3_sharding_config(cfg, enable_sp=enable_sp),
    ),
    "qwen3": _Family(
        registry=tt_qwen3,
        flavors=tt_qwen3.qwen3_configs,
        rope_cls=CosSinRoPE,
        hf_model_type="qwen3",
        hf_architecture="Qwen3ForCausalLM",
        build_config=_build_qwen3_config,
        set_sharding=lambda cfg, enable_sp: set_qwen3_sharding_config(cfg, enable_sp=enable_sp, enable_ep=False),
    ),
}


def _family(name: str) -> _Family:
    if name not in _FAMILIES:
        raise ConfigError(f"model.name={name!r} is invalid: expected one of {', '.join(_FAMILIES)}")
    return _FAMILIES[name]


def _arch_from_model_config(cfg) -> _Arch:
    """Read the hyper-parameters back out of a torchtitan Decoder config (a flavor's or a built one)."""
    attn = cfg.layers[0].attention
    n_heads = attn.n_heads
    ffn = cfg.layers[0].feed_forward
    return _Arch(
        dim=cfg.dim,
        n_layers=len(cfg.layers),
        n_heads=n_heads,
        n_kv_heads=attn.n_kv_heads or n_heads,
        head_dim=attn.head_dim or cfg.dim // n_heads,
        ffn_hidden_dim=ffn.w1.out_features if ffn is not None else 0,
        vocab_size=cfg.vocab_size,
        rope=attn.rope,
        norm_eps=cfg.norm.eps,
        tie_embeddings=cfg.enable_weight_tying,
        fuse_qkv=isinstance(attn.qkv_linear, FusedQKVLinear.Config),
    )


def _is_moe(cfg) -> bool:
    return any(getattr(layer, "moe", None) is not None for layer in cfg.layers)


def _dense_flavors(family: _Family) -> list[str]:
    return [f for f, make in family.flavors.items() if not _is_moe(make(attn_backend="flex"))]


def _flavor_arch(model_cfg: ModelConfig) -> _Arch:
    """The flavor's own hyper-parameters; ConfigError for unknown or MoE flavors."""
    family = _family(model_cfg.name)
    if model_cfg.flavor not in family.flavors:
        raise ConfigError(
            f"model.flavor={model_cfg.flavor!r} is invalid for model.name={model_cfg.name!r}: "
            f"expected one of {', '.join(_dense_flavors(family))}"
        )
    cfg = family.flavors[model_cfg.flavor](attn_backend="flex")
    if _is_moe(cfg):
        raise ConfigError(
            f"model.flavor={model_cfg.flavor!r} is a mixture-of-experts flavor; refexp supports the dense "
            f"flavors: {', '.join(_dense_flavors(family))}"
        )
    return _arch_from_model_config(cfg)


def _apply_overrides(flavor: _Arch, model_cfg: ModelConfig, vocab_size: int | None) -> _Arch:
    """Flavor hyper-parameters with ``model.*`` overrides applied.

    Derived values follow the overrides: head_dim = dim // n_heads when dim or n_heads changes
    (qwen3 flavors carry an explicit head_dim otherwise); n_kv_heads keeps the flavor's
    query-per-kv ratio; ffn_hidden_dim keeps the flavor's ffn/dim ratio.
    """
    m = model_cfg
    dim = m.dim or flavor.dim
    n_heads = m.n_heads or flavor.n_heads
    if (m.dim is not None or m.n_heads is not None) and dim % n_heads:
        raise ConfigError(f"model.dim={dim} is invalid: expected a multiple of n_heads={n_heads}")
    head_dim = flavor.head_dim if (m.dim is None and m.n_heads is None) else dim // n_heads
    if m.n_kv_heads is not None:
        n_kv = m.n_kv_heads
    else:
        n_kv = max(1, n_heads * flavor.n_kv_heads // flavor.n_heads)
    ffn = m.ffn_hidden_dim or (flavor.ffn_hidden_dim * dim // flavor.dim)
    vocab = m.vocab_size or vocab_size or flavor.vocab_size
    if m.vocab_size is not None and vocab_size is not None and vocab_size > m.vocab_size:
        raise ConfigError(
            f"model.vocab_size={m.vocab_size} is invalid: the tokenizer has {vocab_size} tokens "
            f"(expected >= {vocab_size} or null)"
        )
    max_seq_len = m.max_seq_len or flavor.max_seq_len
    rope = dataclasses.replace(flavor.rope, dim=head_dim, max_seq_len=max_seq_len)
    return dataclasses.replace(
        flavor, dim=dim, n_layers=m.n_layers or flavor.n_layers, n_heads=n_heads, n_kv_heads=n_kv,
        head_dim=head_dim, ffn_hidden_dim=ffn, vocab_size=vocab, rope=rope,
    )


def _read_hf_config(hf_dir: str) -> dict:
    path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(path):
        raise ConfigError(f"model.hf_assets_path={hf_dir!r} is invalid: expected a directory with config.json")
    with open(path) as f:
        return json.load(f)


def _hf_rope_params(hf: dict) -> dict:
    """RoPE settings of an HF config in either spelling (transformers 4: rope_theta + rope_scaling;
    transformers 5: rope_parameters)."""
    params = dict(hf.get("rope_parameters") or {})
    if not params:
        params = dict(hf.get("rope_scaling") or {})
        if "rope_theta" in hf:
            params["rope_theta"] = hf["rope_theta"]
    params.setdefault("rope_type", params.pop("type", "default"))
    params.setdefault("rope_theta", 10000.0)
    return params


def _hf_rope_config(name: str, hf: dict, head_dim: int, max_seq_len: int):
    """The torchtitan RoPE config equal to the HF config's rotary embedding, or ConfigError."""
    p = _hf_rope_params(hf)
    kind = p["rope_type"]
    if name == "llama3" and kind == "llama3":
        return ComplexRoPE.Config(
            dim=head_dim, max_seq_len=max_seq_len, theta=float(p["rope_theta"]), scaling="llama",
            scaling_factor=float(p["factor"]), low_freq_factor=float(p["low_freq_factor"]),
            high_freq_factor=float(p["high_freq_factor"]),
            original_max_position_embeddings=int(p["original_max_position_embeddings"]),
        )
    if kind == "default":
        return _family(name).rope_cls.Config(dim=head_dim, max_seq_len=max_seq_len, theta=float(p["rope_theta"]))
    raise ConfigError(
        f"model.hf_assets_path: rope type {kind!r} in config.json is not supported for model.name={name!r} "
        f"(expected {'llama3 or ' if name == 'llama3' else ''}default)"
    )


def model_cfg_overrides_from_hf(hf_dir: str) -> dict[str, Any]:
    """``ModelConfig`` fields that describe the HF checkpoint in ``hf_dir`` (``ModelConfig(**d)``)."""
    hf = _read_hf_config(hf_dir)
    name = {fam.hf_model_type: n for n, fam in _FAMILIES.items()}.get(hf.get("model_type"))
    if name is None:
        raise ConfigError(
            f"model.hf_assets_path={hf_dir!r}: model_type={hf.get('model_type')!r} in config.json is not "
            f"supported (expected one of {', '.join(f.hf_model_type for f in _FAMILIES.values())})"
        )
    return {
        "name": name,
        "dim": hf["hidden_size"],
        "n_layers": hf["num_hidden_layers"],
        "n_heads": hf["num_attention_heads"],
        "n_kv_heads": hf.get("num_key_value_heads") or hf["num_attention_heads"],
        "ffn_hidden_dim": hf["intermediate_size"],
        "vocab_size": hf["vocab_size"],
        "hf_assets_path": hf_dir,
    }


def _hf_arch(model_cfg: ModelConfig, vocab_size: int | None) -> _Arch:
    """Architecture of the HF checkpoint at ``model.hf_assets_path``; ``model.*`` fields that are set
    must agree with it (the weights decide the shapes), except max_seq_len (the RoPE table length)."""
    hf_dir = model_cfg.hf_assets_path
    hf = _read_hf_config(hf_dir)
    found = model_cfg_overrides_from_hf(hf_dir)
    if found["name"] != model_cfg.name:
        raise ConfigError(
            f"model.name={model_cfg.name!r} is invalid: {hf_dir}/config.json holds a "
            f"{hf.get('model_type')!r} model (expected model.name={found['name']})"
        )
    for f in ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden_dim", "vocab_size"):
        mine = getattr(model_cfg, f)
        if mine is not None and mine != found[f]:
            raise ConfigError(
                f"model.{f}={mine} is invalid: {hf_dir}/config.json says {found[f]} (expected null or {found[f]})"
            )
    if vocab_size is not None and vocab_size > found["vocab_size"]:
        raise ConfigError(
            f"model.hf_assets_path={hf_dir!r}: the tokenizer has {vocab_size} tokens but the checkpoint's "
            f"vocab_size is {found['vocab_size']}"
        )
    for unsupported in ("attention_bias", "mlp_bias", "use_sliding_window"):
        if hf.get(unsupported):
            raise ConfigError(f"model.hf_assets_path={hf_dir!r}: {unsupported}=true in config.json is not supported")
    dim, n_heads = found["dim"], found["n_heads"]
    head_dim = hf.get("head_dim") or dim // n_heads
    if model_cfg.name == "llama3" and head_dim != dim // n_heads:
        raise ConfigError(
            f"model.hf_assets_path={hf_dir!r}: llama3 needs head_dim == hidden_size // num_attention_heads"
        )
    max_seq_len = model_cfg.max_seq_len or hf.get("max_position_embeddings") or 4096
    return _Arch(
        dim=dim, n_layers=found["n_layers"], n_heads=n_heads, n_kv_heads=found["n_kv_heads"], head_dim=head_dim,
        ffn_hidden_dim=found["ffn_hidden_dim"], vocab_size=found["vocab_size"],
        rope=_hf_rope_config(model_cfg.name, hf, head_dim, max_seq_len),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    )


def _check_arch(a: _Arch, parallelism: ParallelismConfig | None) -> None:
    """Shape constraints that torchtitan would otherwise hit as an assert or a view error mid-build."""
    if a.n_kv_heads > a.n_heads or a.n_heads % a.n_kv_heads:
        raise ConfigError(f"model.n_kv_heads={a.n_kv_heads} is invalid: expected a divisor of n_heads={a.n_heads}")
    if a.head_dim % 2:
        raise ConfigError(f"model.dim={a.dim} is invalid: head_dim={a.head_dim} must be even for RoPE (dim / n_heads)")
    if parallelism is None:
        return
    tp = parallelism.tensor_parallel_degree
    for what, n in (("n_heads", a.n_heads), ("n_kv_heads", a.n_kv_heads)):
        if n % tp:
            raise ConfigError(
                f"parallelism.tensor_parallel_degree={tp} is invalid: it must divide model {what}={n} "
                f"(attention heads are split across tensor-parallel ranks)"
            )


class MaskedSDPA(ScaledDotProductAttention):
    """torchtitan's SDPA inner attention, which also takes a dense boolean mask.

    ``attention_masks=None`` (every ordinary forward) is torchtitan's own causal path, unchanged.
    A bool tensor ``[B, L, S]`` (True = query may attend to key) goes to SDPA as ``attn_mask``: the
    shared-prompt layout of DPO pairs and GRPO groups (``algos/shared_prompt.py``) needs a mask that
    is not causal by index.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(ScaledDotProductAttention.Config):
        pass

    def forward(self, q_BLNH, k_BLNH, v_BLNH, *, attention_masks=None, scale=None, enable_gqa=False,
                is_causal=True, **kwargs):
        if attention_masks is None:
            return super().forward(q_BLNH, k_BLNH, v_BLNH, scale=scale, enable_gqa=enable_gqa,
                                   is_causal=is_causal, **kwargs)
        if not (isinstance(attention_masks, torch.Tensor) and attention_masks.dtype == torch.bool
                and attention_masks.ndim == 3):
            raise TypeError("MaskedSDPA takes a bool [B, L, S] mask as attention_masks")
        with sdpa_kernel(self.sdpa_backends, set_priority=True):
            out_BNLH = F.scaled_dot_product_attention(
                q_BLNH.transpose(1, 2), k_BLNH.transpose(1, 2), v_BLNH.transpose(1, 2),
                attn_mask=attention_masks.unsqueeze(1), scale=scale, enable_gqa=enable_gqa)
        return out_BNLH.transpose(1, 2)


def _set_attention_backend(cfg, backend: str) -> None:
    """Swap every inner-attention config for ``backend`` (NOTES #3: SDPA is the trainable one on CPU).

    SDPA here is causal attention (pad on the right and mask the loss) that also takes an explicit
    mask when one is given (``MaskedSDPA``).
    """
    if backend == "flex":
        return
    new = MaskedSDPA.Config if backend == "sdpa" else VarlenAttention.Config
    for _, _, parent, attr in list(cfg.traverse(FlexAttention.Config)):
        if isinstance(parent, list):
            parent[attr] = new()
        else:
            setattr(parent, attr, new())


def _set_norm_eps(cfg, eps: float) -> None:
    """torchtitan's llama3 builder leaves block norms at RMSNorm's default eps; HF checkpoints say theirs."""
    for _, norm, _, _ in cfg.traverse(RMSNorm.Config):
        norm.eps = eps


def build_model_spec(
    model_cfg: ModelConfig, *, vocab_size: int | None, parallelism: ParallelismConfig | None = None
) -> ModelSpec:
    """torchtitan ModelSpec for ``model.name``/``model.flavor`` with refexp's overrides; builds no weights.

    Shapes come from, in order: ``model.hf_assets_path``'s config.json when set (then ``model.*`` fields
    must agree with it), else ``model.*`` overrides, else ``vocab_size`` (the tokenizer's) for the
    vocabulary, else the flavor. Raises ConfigError naming the field for an unknown flavor, heads that
    ``parallelism.tensor_parallel_degree`` does not divide, and other impossible shapes.
    """
    family = _family(model_cfg.name)
    flavor = _flavor_arch(model_cfg)
    if model_cfg.hf_assets_path:
        arch = _hf_arch(model_cfg, vocab_size)
        arch = dataclasses.replace(arch, fuse_qkv=flavor.fuse_qkv)
    else:
        arch = _apply_overrides(flavor, model_cfg, vocab_size)
    _check_arch(arch, parallelism)
    cfg = family.build_config(arch)
    _set_norm_eps(cfg, arch.norm_eps)
    _set_attention_backend(cfg, model_cfg.attn_backend)
    # What Llama3Model.Config.update_from_config does for TP, without importing torchtitan.trainer
    # (4-12 s, NOTES #9): declare the TP sharding of every sub-module.
    family.set_sharding(cfg, parallelism.enable_sequence_parallel if parallelism else True)
    spec = family.registry.model_registry(model_cfg.flavor)
    spec.model = cfg
    return spec


# --------------------------------------------------------------------------- building and parallelizing


def _titan_parallelism(parallelism: ParallelismConfig) -> TTParallelismConfig:
    return TTParallelismConfig(
        data_parallel_replicate_degree=parallelism.data_parallel_replicate_degree,
        data_parallel_shard_degree=parallelism.data_parallel_shard_degree,
        tensor_parallel_degree=parallelism.tensor_parallel_degree,
        enable_sequence_parallel=parallelism.enable_sequence_parallel,
        fsdp_reshard_after_forward=parallelism.fsdp_reshard_after_forward,
        spmd_backend=parallelism.spmd_backend,
    )


def make_parallel_dims(parallelism: ParallelismConfig, world_size: int, device_type: str) -> ParallelDims:
    """torchtitan ParallelDims for ``parallelism`` on ``world_size`` ranks (the mesh is built lazily,
    on first use, and needs an initialised process group)."""
    prepare_torchtitan(device_type)
    rep, shard, tp = (
        parallelism.data_parallel_replicate_degree,
        parallelism.data_parallel_shard_degree,
        parallelism.tensor_parallel_degree,
    )
    others = rep * tp
    if shard == -1:
        if world_size % others:
            raise ConfigError(
                f"parallelism.data_parallel_replicate_degree={rep} x parallelism.tensor_parallel_degree={tp} "
                f"= {others} is invalid: it must divide the world size {world_size}"
            )
        shard = world_size // others
    if rep * shard * tp != world_size:
        raise ConfigError(
            f"parallelism degrees are invalid: data_parallel_replicate_degree={rep} x data_parallel_shard_degree="
            f"{shard} x tensor_parallel_degree={tp} = {rep * shard * tp}, expected the world size {world_size}"
        )
    if world_size > 1 and parallelism.spmd_backend != "partial_dtensor":
        # spmd_types: FSDP/TP fail in torchtitan 0.3.0 (NOTES #4). full_dtensor: every module input
        # must already be a DTensor ("Got a plain Tensor under the full_dtensor mode"); refexp passes
        # plain token tensors.
        raise ConfigError(
            f"parallelism.spmd_backend={parallelism.spmd_backend!r} is invalid with more than one rank: "
            f"expected partial_dtensor"
        )
    return ParallelDims(dp_replicate=rep, dp_shard=shard, cp=1, tp=tp, pp=1, ep=1, world_size=world_size,
                        spmd_backend=parallelism.spmd_backend)


def _init_weights_(model: nn.Module, device: torch.device, seed: int, embedding_init_std: float | None = None) -> None:
    """torchtitan's initialisers under ``seed``, without touching the caller's RNG streams.

    ``embedding_init_std`` replaces torchtitan's N(0, 1) token-embedding init (sized for pretraining
    runs). On the 2-layer embedded-task model N(0, 1) embeddings drown the attention's positional
    signal in the residual stream: SFT stayed at ~1% held-out accuracy after 3,000 steps, while
    std 0.02 (HF Llama's init) reached ~70% teacher-forced exact match in 600 steps.
    """
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        model.init_states(buffer_device=device)
        emb = getattr(_decoder(model), "tok_embeddings", None)
        if embedding_init_std is not None and emb is not None and not _decoder(model).enable_weight_tying:
            with torch.no_grad():
                nn.init.normal_(emb.weight, std=embedding_init_std)


def _force_sum_reduction(model: nn.Module) -> None:
    """NOTES #5: FSDP's divide factor 1 uses PREMUL_SUM, which gloo lacks; SUM is the same math here."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)


def _retie_embeddings_after_tp(model: nn.Module) -> None:
    """Keep tied embeddings tied through tensor parallelism.

    TP's ``Module.parallelize`` gives ``tok_embeddings`` and ``lm_head`` each their own DTensor copy
    of a tied weight; torchtitan's trainer re-ties in ``init_states`` *after* FSDP, but refexp
    initialises before parallelizing, so the tie is restored right after TP and before FSDP (which
    then shards one shared parameter), by wrapping this model's ``parallelize``.
    """
    dec = _decoder(model)
    if not dec.enable_weight_tying:
        return
    tensor_parallelize = dec.parallelize

    def parallelize_and_retie(parallel_dims):
        tensor_parallelize(parallel_dims)
        dec.tok_embeddings.weight = dec.lm_head.weight

    dec.parallelize = parallelize_and_retie


def _parallelism_of(mesh: ParallelDims, parallelism: ParallelismConfig | None) -> ParallelismConfig:
    """The ParallelismConfig that goes with ``mesh`` (derived from it when not given; ConfigError when
    the degrees disagree, since the sharding declarations come from the config and the meshes from
    ``mesh``)."""
    if parallelism is None:
        return ParallelismConfig(data_parallel_replicate_degree=mesh.dp_replicate,
                                 data_parallel_shard_degree=mesh.dp_shard, tensor_parallel_degree=mesh.tp,
                                 spmd_backend=mesh.spmd_backend)
    expected = make_parallel_dims(parallelism, mesh.world_size, tt_dist_utils.device_type)
    for degree in ("dp_replicate", "dp_shard", "tp"):
        if getattr(expected, degree) != getattr(mesh, degree):
            raise ConfigError(
                f"parallelism ({degree}={getattr(expected, degree)}) is invalid for the given mesh "
                f"({degree}={getattr(mesh, degree)}): build both from the same ParallelismConfig"
            )
    return parallelism


def _reshard_frozen_after_forward(model: nn.Module) -> None:
    """FSDP keeps the last group (norm, lm_head) unsharded after forward because backward would
    all-gather it again at once; a frozen model has no backward, so that is only held memory."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_reshard_after_forward(True, recurse=False)


def build_model(
    model_cfg: ModelConfig,
    *,
    vocab_size: int | None,
    device: str | torch.device,
    dtype: str = "float32",
    seed: int = 0,
    mesh: ParallelDims | None = None,
    parallelism: ParallelismConfig | None = None,
    compile_cfg: CompileConfig | None = None,
    training_cfg: TrainingConfig | None = None,
    requires_grad: bool = True,
) -> nn.Module:
    """Build, initialise under ``seed``, parallelize and maybe compile a torchtitan decoder.

    Weights are initialised on the full model before parallelizing, so they are the same for every
    world size (see the module docstring). ``mesh`` is a ParallelDims from ``make_parallel_dims``;
    with one rank (or none given) the model stays a plain module. ``requires_grad=False`` freezes it
    (eval mode) for reference copies. Per-block ``torch.compile`` when ``compile_cfg.enable``.
    """
    device = resolve_device(device) if isinstance(device, str) else device
    prepare_torchtitan(device.type)
    parallel = mesh is not None and mesh.world_size > 1
    parallelism = _parallelism_of(mesh, parallelism) if parallel else (parallelism or ParallelismConfig())
    if model_cfg.attn_backend == "varlen" and device.type != "cuda":
        raise ConfigError("model.attn_backend='varlen' is invalid on CPU: it is CUDA-only (expected sdpa; NOTES #3)")
    spec = build_model_spec(model_cfg, vocab_size=vocab_size, parallelism=parallelism)
    # A model-wide switch that torchtitan reads while running, not only while building (NOTES #4).
    tt_dist_utils.set_spmd_backend(parallelism.spmd_backend)

    with torch.device("meta"):
        model = spec.model.build()
    model.to_empty(device=device)
    _init_weights_(model, device, seed, model_cfg.embedding_init_std)
    if dtype != "float32":
        for p in model.parameters():
            p.data = p.data.to(getattr(torch, dtype))
    if not requires_grad:
        model.requires_grad_(False)
        model.eval()

    compile_cfg = compile_cfg or CompileConfig()
    tt_compile = TTCompileConfig(enable=compile_cfg.enable, components=list(compile_cfg.components),
                                 backend=compile_cfg.backend)
    if parallel:
        training_cfg = training_cfg or TrainingConfig()
        _retie_embeddings_after_tp(model)
        spec.parallelize_fn(
            model,
            parallel_dims=mesh,
            training=TTTrainingConfig(
                mixed_precision_param=training_cfg.mixed_precision_param,
                mixed_precision_reduce=training_cfg.mixed_precision_reduce,
            ),
            parallelism=_titan_parallelism(parallelism),
            compile_config=tt_compile,
            ac_config=None,
            dump_folder="",
        )
        _force_sum_reduction(model)
        if not requires_grad and parallelism.fsdp_reshard_after_forward == "default":
            _reshard_frozen_after_forward(model)
    elif tt_compile.enable and "model" in tt_compile.components:
        single = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, world_size=1,
                              spmd_backend=parallelism.spmd_backend)
        apply_compile(model, compile_config=tt_compile, parallel_dims=single)
    return model


# --------------------------------------------------------------------------- forward, logits, log-probs


def _decoder(model: nn.Module) -> nn.Module:
    """The torchtitan Decoder inside ``torch.compile``/DDP-style wrappers."""
    while not hasattr(model, "layers"):
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if inner is None:
            raise TypeError(f"{type(model).__name__} is not a torchtitan decoder")
        model = inner
    return model


def _inner_attention(model: nn.Module) -> nn.Module:
    return next(iter(_decoder(model).layers.values())).attention.inner_attention


def _forward(model: nn.Module, tokens_BT: torch.Tensor, positions_BT: torch.Tensor | None = None,
             allowed_BTT: torch.Tensor | None = None):
    """``model(tokens)``: causal logits [B, T, V] (a vocab-sharded DTensor under TP).

    SDPA needs no mask (causal, NOTES #3); flex/varlen need one, built from positions 0..T-1 per row.
    ``positions_BT``/``allowed_BTT`` (RoPE positions and a bool [B, T, T] attention mask) replace
    0..T-1 and causal attention; only the SDPA backend (``MaskedSDPA``) takes them.
    """
    if allowed_BTT is not None or positions_BT is not None:
        if not isinstance(_inner_attention(model), MaskedSDPA):
            raise ValueError("explicit positions/attention masks need model.attn_backend=sdpa")
        return model(tokens_BT, positions=positions_BT, attention_masks=allowed_BTT)
    if isinstance(_inner_attention(model), ScaledDotProductAttention):
        return model(tokens_BT)
    B, T = tokens_BT.shape
    positions_BT = torch.arange(T, device=tokens_BT.device).expand(B, T)
    masks = _decoder(model).get_attention_masks(positions_BT)
    return model(tokens_BT, attention_masks=masks)


def _outside_inference_mode(model: nn.Module) -> bool:
    """Whether a forward of ``model`` must leave ``torch.inference_mode`` (and run under no_grad).

    torch 2.13's FSDP2 on a 1-rank shard group (TP-only: torchtitan always applies FSDP) copies into
    its unsharded buffer under ``_unsafe_preserve_version_counter``, which fails for inference
    tensors, and DTensor views of the vocab-sharded logits fail in inference mode too ("Cannot set
    version_counter for inference tensor"). Results are the same; only the fast path is lost.
    """
    from torch.distributed.fsdp import FSDPModule

    return torch.is_inference_mode_enabled() and any(isinstance(m, FSDPModule) for m in model.modules())


def _full_vocab(x: torch.Tensor) -> torch.Tensor:
    """A vocab-sharded DTensor gathered into a plain tensor (plain tensors pass through)."""
    return x.full_tensor() if isinstance(x, DTensor) else x


def logits(model: nn.Module, tokens_BT: torch.Tensor) -> torch.Tensor:
    """Full logits float32 [B, T, V] (all-gathered over the vocab under TP). Only for small
    vocabularies / debugging: prefer ``token_logprobs``."""
    if _outside_inference_mode(model):
        with torch.inference_mode(False), torch.no_grad():
            return logits(model, tokens_BT)
    return _full_vocab(_forward(model, tokens_BT)).float()


def _vocab_shard_mesh_dim(x: DTensor) -> int:
    dims = [i for i, p in enumerate(x.placements) if isinstance(p, Shard) and p.dim in (-1, x.ndim - 1)]
    others = [p for i, p in enumerate(x.placements) if i not in dims and not isinstance(p, Replicate)]
    if len(dims) != 1 or others:
        raise ValueError(f"expected logits sharded over the vocabulary on one mesh dim, got {x.placements}")
    return dims[0]


def _sum_over_mesh_dim(local: torch.Tensor, like: DTensor, mesh_dim: int) -> torch.Tensor:
    """All-reduce SUM of ``local`` over one mesh dim, autograd-aware: the backward is the identity,
    which is right for a loss every TP rank computes identically (DTensor Partial -> Replicate)."""
    placements = [Replicate()] * like.device_mesh.ndim
    placements[mesh_dim] = Partial()
    return DTensor.from_local(local, like.device_mesh, placements, run_check=False).full_tensor()


def _vocab_parallel_logprobs(logits_BTV: DTensor, targets_BT: torch.Tensor, temperature: float,
                             with_entropy: bool):
    """log p(target) (and entropy) from vocab-sharded logits without gathering the vocabulary:
    each rank works on its [B, T, V/tp] slice; max, sum-exp and the target logit are all-reduced."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    mesh_dim = _vocab_shard_mesh_dim(logits_BTV)
    local_shape, offset = compute_local_shape_and_global_offset(
        logits_BTV.shape, logits_BTV.device_mesh, logits_BTV.placements
    )
    v0, v_local = offset[-1], local_shape[-1]
    z_BTv = logits_BTV.to_local().float() / temperature
    m_BT1 = z_BTv.detach().amax(-1, keepdim=True)
    dist.all_reduce(m_BT1, op=dist.ReduceOp.MAX, group=logits_BTV.device_mesh.get_group(mesh_dim))
    z_BTv = z_BTv - m_BT1  # a constant shift: log-softmax is unchanged, exp cannot overflow
    lse_BT = _sum_over_mesh_dim(z_BTv.exp().sum(-1), logits_BTV, mesh_dim).log()
    mine_BT = (targets_BT >= v0) & (targets_BT < v0 + v_local)
    idx_BT1 = (targets_BT - v0).clamp(0, v_local - 1).unsqueeze(-1)
    target_BT = _sum_over_mesh_dim(z_BTv.gather(-1, idx_BT1).squeeze(-1) * mine_BT, logits_BTV, mesh_dim)
    logp_BT = target_BT - lse_BT
    if not with_entropy:
        return logp_BT, None
    logq_BTv = z_BTv - lse_BT.unsqueeze(-1)
    entropy_BT = -_sum_over_mesh_dim((logq_BTv.exp() * logq_BTv).sum(-1), logits_BTV, mesh_dim)
    return logp_BT, entropy_BT


def token_logprobs(model: nn.Module, tokens_BT: torch.LongTensor, *, temperature: float = 1.0,
                   with_entropy: bool = False, positions_BT: torch.Tensor | None = None,
                   allowed_BTT: torch.Tensor | None = None):
    """Next-token log-probabilities of a batch, float32 [B, T-1].

    ``logp_BT[:, t] = log p(tokens[:, t+1] | tokens[:, :t+1])`` under softmax(logits / temperature).
    Rows are plain causal sequences (pad on the right, mask afterwards) unless ``positions_BT`` and
    ``allowed_BTT`` (bool [B, T, T], query x key) say otherwise: then column t is the distribution at
    position t given the keys it may attend to. Differentiable. Under TP the vocab-sharded logits are
    never gathered. With ``with_entropy`` also returns the entropy [B, T-1] of the same tempered
    next-token distribution. Returns log-probs, never logits.
    """
    if _outside_inference_mode(model):
        with torch.inference_mode(False), torch.no_grad():
            return token_logprobs(model, tokens_BT, temperature=temperature, with_entropy=with_entropy,
                                  positions_BT=positions_BT, allowed_BTT=allowed_BTT)
    out_BTV = _forward(model, tokens_BT, positions_BT, allowed_BTT)[:, :-1]
    targets_BT = tokens_BT[:, 1:]
    if isinstance(out_BTV, DTensor):
        logp_BT, entropy_BT = _vocab_parallel_logprobs(out_BTV, targets_BT, temperature, with_entropy)
    else:
        z_BTV = out_BTV.float()
        if temperature != 1.0:
            z_BTV = z_BTV / temperature
        lse_BT = torch.logsumexp(z_BTV, dim=-1)
        # gather - logsumexp keeps one [B, T, V] tensor alive instead of log_softmax's second one.
        logp_BT = z_BTV.gather(-1, targets_BT.unsqueeze(-1)).squeeze(-1) - lse_BT
        entropy_BT = None
        if with_entropy:
            logq_BTV = z_BTV - lse_BT.unsqueeze(-1)
            entropy_BT = -(logq_BTV.exp() * logq_BTV).sum(-1)
    return (logp_BT, entropy_BT) if with_entropy else logp_BT


# --------------------------------------------------------------------------- weights

# Wrappers that insert a path component into parameter names (NOTES #8): activation checkpointing,
# torch.compile(model), FSDP1/DDP.
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
    model's own layout (DTensor shards stay shards, no communication). Not a file format: use the
    checkpoint module (DCP) for files, ``export_hf`` for HF safetensors."""
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


_HF_SIDECAR_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def export_hf(model: nn.Module, model_cfg: ModelConfig, out_dir: str) -> None:
    """Write ``model`` as an HF checkpoint (model.safetensors + config.json) into ``out_dir``.

    Collective: call on every rank; sharded tensors are gathered one at a time and rank 0 writes.
    Tokenizer files are copied from ``model.hf_assets_path`` when it has them.
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
        src = model_cfg.hf_assets_path
        for fname in _HF_SIDECAR_FILES:
            if src and os.path.isfile(os.path.join(src, fname)):
                shutil.copy(os.path.join(src, fname), os.path.join(out_dir, fname))
    if dist.is_initialized():
        dist.barrier()


# --------------------------------------------------------------------------- KV-cache decoding


@dataclass
class DecodeState:
    """Everything ``decode_step`` needs between steps.

    Slots are the columns of the left-padded batch: ``valid_BS`` marks real tokens, ``tokens_BS``
    holds them. ``keys``/``values`` hold per-layer [B, n_kv_heads, S, head_dim] after RoPE (empty in
    recompute mode): views of the first S slots of preallocated buffers (``key_bufs``/``value_bufs``,
    ``capacity`` slots, grown by doubling), so a decode step writes one slot in place instead of
    copying the whole cache (``torch.cat`` per layer per step was ~a quarter of decoding time).
    ``next_pos_B`` is the RoPE position of each row's next token. ``padded``: some prompt was
    left-padded, so attention needs the explicit ``valid_BS`` mask (otherwise it is plain causal).
    """

    tokens_BS: torch.Tensor
    valid_BS: torch.Tensor
    next_pos_B: torch.Tensor
    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    recompute: bool = False
    unsharded: list[nn.Module] = field(default_factory=list)
    capacity: int = 0
    key_bufs: list[torch.Tensor] = field(default_factory=list)
    value_bufs: list[torch.Tensor] = field(default_factory=list)
    padded: bool = True


def _unshard_for_decoding(model: nn.Module) -> list[nn.Module]:
    """Unshard every FSDP module (a collective: every rank must decode) so that its sub-modules hold
    full weights; ``finish_decode`` reshards them."""
    from torch.distributed.fsdp import FSDPModule

    fsdp_modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in fsdp_modules:
        m.unshard()
    return fsdp_modules


def _call_without_hooks(module: nn.Module, *args):
    """``module.forward`` directly: FSDP's pre/post-forward hooks would reshard what we unsharded."""
    return module.forward(*args)


def _append_kv(state: DecodeState, layer: int, k_BNLH: torch.Tensor, v_BNLH: torch.Tensor) -> int:
    """Write the new keys/values into the layer's buffers (in place; doubling when full), point
    ``state.keys[layer]``/``values[layer]`` at the filled slots, and return how many were filled before."""
    B, N, L, H = k_BNLH.shape
    if layer == len(state.key_bufs):  # prefill: the layer's first tokens
        start, cap = 0, max(state.capacity, L)
        state.key_bufs.append(k_BNLH.new_empty(B, N, cap, H))
        state.value_bufs.append(v_BNLH.new_empty(B, N, cap, H))
        state.keys.append(k_BNLH)
        state.values.append(v_BNLH)
    else:
        start = state.keys[layer].shape[2]
    kb, vb = state.key_bufs[layer], state.value_bufs[layer]
    if start + L > kb.shape[2]:
        cap = max(2 * kb.shape[2], start + L)
        kb = torch.cat([kb[:, :, :start], kb.new_empty(B, N, cap - start, H)], dim=2)
        vb = torch.cat([vb[:, :, :start], vb.new_empty(B, N, cap - start, H)], dim=2)
        state.key_bufs[layer], state.value_bufs[layer] = kb, vb
    kb[:, :, start:start + L].copy_(k_BNLH)
    vb[:, :, start:start + L].copy_(v_BNLH)
    state.keys[layer], state.values[layer] = kb[:, :, :start + L], vb[:, :, :start + L]
    return start


def _attend(attention: nn.Module, x_BLD: torch.Tensor, positions_BL: torch.Tensor, state: DecodeState,
            layer: int, allowed_BLS: torch.Tensor | None) -> torch.Tensor:
    """GQAttention's forward with the layer's keys/values appended to the cache.

    ``allowed_BLS`` is the explicit mask (query, slot); None when no row is padded: then the new
    tokens see every cached slot and each other causally (SDPA's ``is_causal`` for a first block,
    no mask at all for one new token).
    """
    q_BLNH, k_BLNH, v_BLNH = attention.qkv_linear(x_BLD)
    if attention.q_norm is not None:  # qwen3: QK-norm before RoPE, as GQAttention.forward
        q_BLNH, k_BLNH = attention.q_norm(q_BLNH), attention.k_norm(k_BLNH)
    q_BLNH, k_BLNH = attention.rope(q_BLNH, k_BLNH, positions_BL)
    L = q_BLNH.shape[1]
    start = _append_kv(state, layer, k_BLNH.transpose(1, 2), v_BLNH.transpose(1, 2))
    is_causal = False
    if allowed_BLS is None and L > 1:
        if start == 0:
            is_causal = True
        else:  # several new tokens after a cache: causal among themselves, all cached slots visible
            S = start + L
            allowed_BLS = (torch.arange(S, device=x_BLD.device)[None, :]
                           <= torch.arange(start, S, device=x_BLD.device)[:, None]).expand(x_BLD.shape[0], L, S)
    out_BNLH = F.scaled_dot_product_attention(
        q_BLNH.transpose(1, 2), state.keys[layer], state.values[layer],
        attn_mask=None if allowed_BLS is None else allowed_BLS.unsqueeze(1), is_causal=is_causal,
        scale=attention.scaling, enable_gqa=attention.enable_gqa,
    )
    return attention.wo(out_BNLH.transpose(1, 2).flatten(2))


def _cached_forward(model: nn.Module, tokens_BL: torch.Tensor, positions_BL: torch.Tensor,
                    state: DecodeState, allowed_BLS: torch.Tensor | None) -> torch.Tensor:
    """The decoder's forward over new tokens, attending to cached keys; last-position logits [B, V]."""
    dec = _decoder(model)
    h = _call_without_hooks(dec.tok_embeddings, tokens_BL)
    for i, block in enumerate(dec.layers.values()):
        h = h + _attend(block.attention, block.attention_norm(h), positions_BL, state, i, allowed_BLS)
        h = h + block.feed_forward(block.ffn_norm(h))
    h_BD = _call_without_hooks(dec.norm, h[:, -1])
    return _call_without_hooks(dec.lm_head, h_BD).float()


def _recompute_logits(model: nn.Module, state: DecodeState) -> torch.Tensor:
    """Last-token logits [B, V] by re-running the whole model (the TP path).

    Each row's real tokens are moved to the left (right padding), so plain causal attention never
    sees a pad before a real token, and the logits are read at each row's last real token.
    """
    lens_B = state.valid_BS.sum(1)
    S = state.tokens_BS.shape[1]
    # Stable sort puts real slots (key 0) first, in their original order.
    order_BS = torch.sort((~state.valid_BS).to(torch.int8), dim=1, stable=True).indices
    right_BS = torch.where(torch.arange(S, device=lens_B.device) < lens_B[:, None],
                           state.tokens_BS.gather(1, order_BS), torch.zeros_like(state.tokens_BS))
    out_BSV = _forward(model, right_BS[:, : int(lens_B.max())])
    rows_B = torch.arange(len(lens_B), device=lens_B.device)
    if isinstance(out_BSV, DTensor):  # vocab-sharded: pick rows locally, gather only [B, V]
        mesh_dim = _vocab_shard_mesh_dim(out_BSV)
        last_Bv = out_BSV.to_local()[rows_B, lens_B - 1]
        placements = [Replicate()] * out_BSV.device_mesh.ndim
        placements[mesh_dim] = Shard(1)
        B, V = last_Bv.shape[0], out_BSV.shape[-1]  # global V: shards may be uneven
        last_BV = DTensor.from_local(last_Bv, out_BSV.device_mesh, placements, run_check=False, shape=(B, V),
                                     stride=(V, 1))
        return last_BV.full_tensor().float()
    return out_BSV[rows_B, lens_B - 1].float()


def _has_dtensor_weights(model: nn.Module) -> bool:
    return any(isinstance(p, DTensor) for p in model.parameters())


@torch.no_grad()
def prefill(model: nn.Module, prompt_BL: torch.LongTensor, prompt_lens_B: torch.LongTensor, *,
            max_new_tokens: int = 0):
    """Start incremental decoding of left-padded prompts: returns (last_logits_BV float32, state).

    ``prompt_BL`` is left-padded to a common length L; row b's real tokens are its last
    ``prompt_lens_B[b]`` columns. Positions start at 0 at each row's first real token; pad keys are
    masked. Builds a KV cache out of the decoder's own sub-modules (llama3, dense qwen3). Under FSDP2
    the FSDP modules are unsharded until ``finish_decode``. Under TP (DTensor weights) there is no
    cache: every step re-runs ``model(...)`` over the whole sequence (correct, O(T) slower).
    Collective under FSDP/TP: every rank must decode the same number of steps.
    ``max_new_tokens``: decode steps to reserve cache slots for (more still fit: the cache grows).
    """
    L = prompt_BL.shape[1]
    lens_B = prompt_lens_B.to(prompt_BL.device)
    slots_L = torch.arange(L, device=prompt_BL.device)
    first_B1 = (L - lens_B)[:, None]  # slot of each row's first real token
    valid_BL = slots_L >= first_B1
    positions_BL = (slots_L - first_B1).clamp(min=0)
    state = DecodeState(tokens_BS=prompt_BL.clone(), valid_BS=valid_BL, next_pos_B=lens_B.clone(),
                        capacity=L + max(0, int(max_new_tokens)), padded=bool((lens_B < L).any()))
    state.unsharded = _unshard_for_decoding(model)
    if _has_dtensor_weights(model):
        state.recompute = True
        return _recompute_logits(model, state), state
    if not state.padded:  # plain causal attention, no mask to build or apply
        return _cached_forward(model, prompt_BL, positions_BL, state, None), state
    # Query i sees real keys j <= i; pad queries see themselves only (their output is never used,
    # but an all-masked row would be NaN).
    causal_LL = slots_L[None, :] <= slots_L[:, None]
    allowed_BLL = (causal_LL & valid_BL[:, None, :]) | torch.eye(L, dtype=torch.bool, device=prompt_BL.device)
    return _cached_forward(model, prompt_BL, positions_BL, state, allowed_BLL), state


@torch.no_grad()
def decode_step(model: nn.Module, next_tokens_B: torch.LongTensor, state: DecodeState):
    """Append one token per row; returns (logits_BV float32 for the following token, state)."""
    tokens_B1 = next_tokens_B.reshape(-1, 1).to(state.tokens_BS.device)
    positions_B1 = state.next_pos_B[:, None]
    state.tokens_BS = torch.cat([state.tokens_BS, tokens_B1], dim=1)
    state.valid_BS = torch.cat([state.valid_BS, torch.ones_like(tokens_B1, dtype=torch.bool)], dim=1)
    state.next_pos_B = state.next_pos_B + 1
    if state.recompute:
        return _recompute_logits(model, state), state
    allowed_B1S = state.valid_BS[:, None, :] if state.padded else None
    return _cached_forward(model, tokens_B1, positions_B1, state, allowed_B1S), state


def repeat_decode_rows(state: DecodeState, rows_B: torch.LongTensor) -> DecodeState:
    """A state whose row b continues ``state``'s row ``rows_B[b]`` (prefill each distinct prompt once,
    then decode G rows of it: GRPO's groups). Copies the filled cache slots; shares the FSDP unshard."""
    rows_B = rows_B.to(state.tokens_BS.device)
    out = DecodeState(tokens_BS=state.tokens_BS[rows_B], valid_BS=state.valid_BS[rows_B],
                      next_pos_B=state.next_pos_B[rows_B], recompute=state.recompute, unsharded=state.unsharded,
                      capacity=state.capacity, padded=state.padded)
    for kb, vb, k in zip(state.key_bufs, state.value_bufs, state.keys):
        filled = k.shape[2]
        for src, dst in ((kb, out.key_bufs), (vb, out.value_bufs)):
            buf = src.new_empty(len(rows_B), *src.shape[1:])
            buf[:, :, :filled] = src[rows_B, :, :filled]
            dst.append(buf)
        out.keys.append(out.key_bufs[-1][:, :, :filled])
        out.values.append(out.value_bufs[-1][:, :, :filled])
    state.unsharded = []  # now owned by ``out``: finish_decode(out) reshards
    return out


def finish_decode(state: DecodeState) -> None:
    """Reshard what ``prefill`` unsharded and drop the cache (collective under FSDP)."""
    for m in state.unsharded:
        m.reshard()
    state.unsharded = []
    state.keys, state.values = [], []
    state.key_bufs, state.value_bufs = [], []
