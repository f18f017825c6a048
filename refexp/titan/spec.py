"""torchtitan model configs for refexp's ``model.*`` settings: families, flavors, overrides, HF config.json.

The model config is rebuilt from the flavor's hyper-parameters (``_Arch``) with refexp's overrides
(``model.dim`` ...) or an HF ``config.json``, through the family's own layer builders, so a shrunk
flavor is initialised exactly like torchtitan initialises that shape. ``build_model_spec`` checks
the shapes (``_check_arch``) and builds no weights.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any

from torchtitan.models import llama3 as tt_llama3
from torchtitan.models import qwen3 as tt_qwen3
from torchtitan.models.common import ComplexRoPE, CosSinRoPE, Embedding, FusedQKVLinear, Linear, RMSNorm
from torchtitan.models.llama3.sharding import set_llama3_sharding_config
from torchtitan.models.qwen3.sharding import set_qwen3_sharding_config
from torchtitan.protocols.model_spec import ModelSpec

from refexp.config import ConfigError, ModelConfig, ParallelismConfig
from refexp.titan.attention import _set_attention_backend


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


def _decoder_config(a: _Arch, family, model_cls, build_layers, *, lm_head_init, **layer_kwargs):
    """``model_cls.Config`` for ``a`` through the family's own layer builder and inits (``family`` is the
    torchtitan model package that defines ``_EMBEDDING_INIT``, ``_EMBEDDING_SKIP_INIT`` and ``_NORM_INIT``)."""
    return model_cls.Config(
        dim=a.dim,
        vocab_size=a.vocab_size,
        enable_weight_tying=a.tie_embeddings,
        tok_embeddings=Embedding.Config(
            num_embeddings=a.vocab_size,
            embedding_dim=a.dim,
            param_init=family._EMBEDDING_SKIP_INIT if a.tie_embeddings else family._EMBEDDING_INIT,
        ),
        norm=RMSNorm.Config(normalized_shape=a.dim, eps=a.norm_eps, param_init=family._NORM_INIT),
        lm_head=Linear.Config(in_features=a.dim, out_features=a.vocab_size, param_init=lm_head_init),
        layers=build_layers(
            n_layers=a.n_layers,
            dim=a.dim,
            n_heads=a.n_heads,
            n_kv_heads=a.n_kv_heads,
            hidden_dim=a.ffn_hidden_dim,
            rope=a.rope,
            fuse_qkv=a.fuse_qkv,
            attn_backend="flex",  # swapped by _set_attention_backend; the builders refuse "sdpa"
            **layer_kwargs,
        ),
    )


def _build_llama3_config(a: _Arch):
    """Llama3Model.Config for ``a``: torchtitan's llama3 builder, output layer scaled by ``dim``."""
    L = tt_llama3
    return _decoder_config(a, L, L.Llama3Model, L._build_llama3_layers, lm_head_init=L._output_linear_init(a.dim))


def _build_qwen3_config(a: _Arch):
    """Qwen3Model.Config (dense) for ``a``: torchtitan's qwen3 builder, with an explicit ``head_dim``."""
    Q = tt_qwen3
    return _decoder_config(a, Q, Q.Qwen3Model, Q._build_qwen3_layers, lm_head_init=Q._LINEAR_INIT,
                           head_dim=a.head_dim)


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
    # (4-12 s, docs/torchtitan-notes.md §9): declare the TP sharding of every sub-module.
    family.set_sharding(cfg, parallelism.enable_sequence_parallel if parallelism else True)
    spec = family.registry.model_registry(model_cfg.flavor)
    spec.model = cfg
    return spec
