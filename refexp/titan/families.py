"""The dense decoder families refexp builds (llama3, qwen3): for each, torchtitan's package, flavors,
RoPE class, HF names, config builder and TP sharding declarations; and ``Arch``, the hyper-parameters
that decide a decoder's shapes, read from a torchtitan config or turned into one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchtitan.models import llama3 as tt_llama3
from torchtitan.models import qwen3 as tt_qwen3
from torchtitan.models.common import ComplexRoPE, CosSinRoPE, Embedding, FusedQKVLinear, Linear, RMSNorm
from torchtitan.models.llama3.sharding import set_llama3_sharding_config
from torchtitan.models.qwen3.sharding import set_qwen3_sharding_config

from refexp.config import ConfigError


@dataclass(frozen=True)
class Arch:
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


def _decoder_config(arch: Arch, family, model_cls, build_layers, *, lm_head_init, **layer_kwargs):
    """``model_cls.Config`` for ``arch`` through the family's own layer builder and inits (``family`` is the
    torchtitan model package that defines ``_EMBEDDING_INIT``, ``_EMBEDDING_SKIP_INIT`` and ``_NORM_INIT``)."""
    return model_cls.Config(
        dim=arch.dim,
        vocab_size=arch.vocab_size,
        enable_weight_tying=arch.tie_embeddings,
        tok_embeddings=Embedding.Config(
            num_embeddings=arch.vocab_size,
            embedding_dim=arch.dim,
            param_init=family._EMBEDDING_SKIP_INIT if arch.tie_embeddings else family._EMBEDDING_INIT,
        ),
        norm=RMSNorm.Config(normalized_shape=arch.dim, eps=arch.norm_eps, param_init=family._NORM_INIT),
        lm_head=Linear.Config(in_features=arch.dim, out_features=arch.vocab_size, param_init=lm_head_init),
        layers=build_layers(
            n_layers=arch.n_layers,
            dim=arch.dim,
            n_heads=arch.n_heads,
            n_kv_heads=arch.n_kv_heads,
            hidden_dim=arch.ffn_hidden_dim,
            rope=arch.rope,
            fuse_qkv=arch.fuse_qkv,
            attn_backend="flex",  # swapped by set_attention_backend; the builders refuse "sdpa"
            **layer_kwargs,
        ),
    )


def _build_llama3_config(arch: Arch):
    """Llama3Model.Config for ``arch``: torchtitan's llama3 builder, output layer scaled by ``dim``."""
    return _decoder_config(arch, tt_llama3, tt_llama3.Llama3Model, tt_llama3._build_llama3_layers,
                           lm_head_init=tt_llama3._output_linear_init(arch.dim))


def _build_qwen3_config(arch: Arch):
    """Qwen3Model.Config (dense) for ``arch``: torchtitan's qwen3 builder, with an explicit ``head_dim``."""
    return _decoder_config(arch, tt_qwen3, tt_qwen3.Qwen3Model, tt_qwen3._build_qwen3_layers,
                           lm_head_init=tt_qwen3._LINEAR_INIT, head_dim=arch.head_dim)


@dataclass(frozen=True)
class Family:
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
FAMILIES = {
    "llama3": Family(
        registry=tt_llama3,
        flavors=tt_llama3.llama3_configs,
        rope_cls=ComplexRoPE,
        hf_model_type="llama",
        hf_architecture="LlamaForCausalLM",
        build_config=_build_llama3_config,
        set_sharding=lambda cfg, enable_sp: set_llama3_sharding_config(cfg, enable_sp=enable_sp),
    ),
    "qwen3": Family(
        registry=tt_qwen3,
        flavors=tt_qwen3.qwen3_configs,
        rope_cls=CosSinRoPE,
        hf_model_type="qwen3",
        hf_architecture="Qwen3ForCausalLM",
        build_config=_build_qwen3_config,
        set_sharding=lambda cfg, enable_sp: set_qwen3_sharding_config(cfg, enable_sp=enable_sp, enable_ep=False),
    ),
}


def model_family(name: str) -> Family:
    """The family of ``model.name``; ConfigError for one refexp does not build."""
    if name not in FAMILIES:
        raise ConfigError(f"model.name={name!r} is invalid: expected one of {', '.join(FAMILIES)}")
    return FAMILIES[name]


def arch_from_model_config(cfg) -> Arch:
    """Read the hyper-parameters back out of a torchtitan Decoder config (a flavor's or a built one)."""
    attn = cfg.layers[0].attention
    n_heads = attn.n_heads
    ffn = cfg.layers[0].feed_forward
    return Arch(
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
