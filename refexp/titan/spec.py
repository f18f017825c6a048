"""torchtitan model specs for refexp's ``model.*`` settings (``build_model_spec``): a flavor's shapes with
``model.*`` overrides, or an HF checkpoint's config.json, built through the family's own layer builders so
a shrunk flavor is initialised exactly like torchtitan initialises that shape. Builds no weights.
"""

from __future__ import annotations

import dataclasses

from torchtitan.models.common import RMSNorm
from torchtitan.protocols.model_spec import ModelSpec

from refexp.config import ConfigError, ModelConfig, ParallelismConfig
from refexp.config.model import check_attention_heads
from refexp.titan.attention import set_attention_backend
from refexp.titan.families import Arch, Family, arch_from_model_config, model_family
from refexp.titan.hf_config import hf_arch


def _is_moe(cfg) -> bool:
    return any(getattr(layer, "moe", None) is not None for layer in cfg.layers)


def _dense_flavors(family: Family) -> list[str]:
    return [flavor for flavor, make in family.flavors.items() if not _is_moe(make(attn_backend="flex"))]


def _flavor_arch(model_cfg: ModelConfig) -> Arch:
    """The flavor's own hyper-parameters; ConfigError for unknown or MoE flavors."""
    family = model_family(model_cfg.name)
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
    return arch_from_model_config(cfg)


def _apply_overrides(flavor: Arch, model_cfg: ModelConfig, vocab_size: int | None) -> Arch:
    """Flavor hyper-parameters with ``model.*`` overrides applied.

    Derived values follow the overrides: head_dim = dim // n_heads when dim or n_heads changes
    (qwen3 flavors carry an explicit head_dim otherwise); n_kv_heads keeps the flavor's
    query-per-kv ratio; ffn_hidden_dim keeps the flavor's ffn/dim ratio.
    """
    dim = model_cfg.dim or flavor.dim
    n_heads = model_cfg.n_heads or flavor.n_heads
    if (model_cfg.dim is not None or model_cfg.n_heads is not None) and dim % n_heads:
        raise ConfigError(f"model.dim={dim} is invalid: expected a multiple of n_heads={n_heads}")
    head_dim = flavor.head_dim if (model_cfg.dim is None and model_cfg.n_heads is None) else dim // n_heads
    if model_cfg.n_kv_heads is not None:
        n_kv = model_cfg.n_kv_heads
    else:
        n_kv = max(1, n_heads * flavor.n_kv_heads // flavor.n_heads)
    ffn = model_cfg.ffn_hidden_dim or (flavor.ffn_hidden_dim * dim // flavor.dim)
    vocab = model_cfg.vocab_size or vocab_size or flavor.vocab_size
    if model_cfg.vocab_size is not None and vocab_size is not None and vocab_size > model_cfg.vocab_size:
        raise ConfigError(
            f"model.vocab_size={model_cfg.vocab_size} is invalid: the tokenizer has {vocab_size} tokens "
            f"(expected >= {vocab_size} or null)"
        )
    max_seq_len = model_cfg.max_seq_len or flavor.max_seq_len
    rope = dataclasses.replace(flavor.rope, dim=head_dim, max_seq_len=max_seq_len)
    if model_cfg.rope_theta is not None:
        rope = dataclasses.replace(rope, theta=model_cfg.rope_theta)
    return dataclasses.replace(
        flavor, dim=dim, n_layers=model_cfg.n_layers or flavor.n_layers, n_heads=n_heads, n_kv_heads=n_kv,
        head_dim=head_dim, ffn_hidden_dim=ffn, vocab_size=vocab, rope=rope,
    )


def _set_norm_eps(cfg, eps: float) -> None:
    """torchtitan's llama3 builder leaves block norms at RMSNorm's default eps; HF checkpoints say theirs."""
    for _, norm, _, _ in cfg.traverse(RMSNorm.Config):
        norm.eps = eps


def model_arch(model_cfg: ModelConfig, vocab_size: int | None) -> Arch:
    """The shapes ``build_model_spec`` builds (its docstring says from where); ConfigError as it raises them."""
    flavor = _flavor_arch(model_cfg)
    if model_cfg.hf_assets_path:
        return dataclasses.replace(hf_arch(model_cfg, vocab_size), fuse_qkv=flavor.fuse_qkv)
    return _apply_overrides(flavor, model_cfg, vocab_size)


def build_model_spec(
    model_cfg: ModelConfig, *, vocab_size: int | None, parallelism: ParallelismConfig | None = None
) -> ModelSpec:
    """torchtitan ModelSpec for ``model.name``/``model.flavor`` with refexp's overrides; builds no weights.

    Shapes come from, in order: ``model.hf_assets_path``'s config.json when set (then ``model.*`` fields
    must agree with it), else ``model.*`` overrides, else ``vocab_size`` (the tokenizer's) for the
    vocabulary, else the flavor. Raises ConfigError naming the field for an unknown flavor, heads that
    ``parallelism.tensor_parallel_degree`` does not divide, and other impossible shapes
    (``config.model.check_attention_heads`` on the resolved shapes).
    """
    family = model_family(model_cfg.name)
    arch = model_arch(model_cfg, vocab_size)
    check_attention_heads(n_heads=arch.n_heads, n_kv_heads=arch.n_kv_heads, dim=arch.dim, head_dim=arch.head_dim,
                          tensor_parallel_degree=parallelism.tensor_parallel_degree if parallelism else 1)
    cfg = family.build_config(arch)
    _set_norm_eps(cfg, arch.norm_eps)
    set_attention_backend(cfg, model_cfg.attn_backend)
    # What Llama3Model.Config.update_from_config does for TP, without importing torchtitan.trainer
    # (4-12 s, docs/torchtitan-notes.md §9): declare the TP sharding of every sub-module.
    family.set_sharding(cfg, parallelism.enable_sequence_parallel if parallelism else True)
    spec = family.registry.model_registry(model_cfg.flavor)
    spec.model = cfg
    return spec
