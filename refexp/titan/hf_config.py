"""An HF checkpoint's config.json in both directions: read into refexp's ``model.*`` fields and an
``Arch`` (``model.hf_assets_path``: the weights decide the shapes), and written for an export that
transformers 4 and 5 read.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from torchtitan.models.common import ComplexRoPE

from refexp.config import ConfigError, ModelConfig
from refexp.titan.families import FAMILIES, Arch, model_family


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
    params = _hf_rope_params(hf)
    kind = params["rope_type"]
    if name == "llama3" and kind == "llama3":
        return ComplexRoPE.Config(
            dim=head_dim, max_seq_len=max_seq_len, theta=float(params["rope_theta"]), scaling="llama",
            scaling_factor=float(params["factor"]), low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position_embeddings=int(params["original_max_position_embeddings"]),
        )
    if kind == "default":
        return model_family(name).rope_cls.Config(dim=head_dim, max_seq_len=max_seq_len,
                                                  theta=float(params["rope_theta"]))
    raise ConfigError(
        f"model.hf_assets_path: rope type {kind!r} in config.json is not supported for model.name={name!r} "
        f"(expected {'llama3 or ' if name == 'llama3' else ''}default)"
    )


def model_cfg_overrides_from_hf(hf_dir: str) -> dict[str, Any]:
    """``ModelConfig`` fields that describe the HF checkpoint in ``hf_dir`` (``ModelConfig(**d)``)."""
    hf = _read_hf_config(hf_dir)
    name = {family.hf_model_type: family_name for family_name, family in FAMILIES.items()}.get(hf.get("model_type"))
    if name is None:
        raise ConfigError(
            f"model.hf_assets_path={hf_dir!r}: model_type={hf.get('model_type')!r} in config.json is not "
            f"supported (expected one of {', '.join(family.hf_model_type for family in FAMILIES.values())})"
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


def hf_arch(model_cfg: ModelConfig, vocab_size: int | None) -> Arch:
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
    for field_name in ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden_dim", "vocab_size"):
        mine = getattr(model_cfg, field_name)
        if mine is not None and mine != found[field_name]:
            raise ConfigError(
                f"model.{field_name}={mine} is invalid: {hf_dir}/config.json says {found[field_name]} "
                f"(expected null or {found[field_name]})"
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
    theta = float(_hf_rope_params(hf)["rope_theta"])
    if model_cfg.rope_theta is not None and float(model_cfg.rope_theta) != theta:
        raise ConfigError(f"model.rope_theta={model_cfg.rope_theta} is invalid: {hf_dir}/config.json says {theta:g}, "
                          f"which its weights were trained with (expected null or {theta:g})")
    max_seq_len = model_cfg.max_seq_len or hf.get("max_position_embeddings") or 4096
    return Arch(
        dim=dim, n_layers=found["n_layers"], n_heads=n_heads, n_kv_heads=found["n_kv_heads"], head_dim=head_dim,
        ffn_hidden_dim=found["ffn_hidden_dim"], vocab_size=found["vocab_size"],
        rope=_hf_rope_config(model_cfg.name, hf, head_dim, max_seq_len),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    )


def _hf_config_dict(name: str, arch: Arch, dtype: torch.dtype) -> dict:
    """An HF config.json for ``arch`` readable by transformers 4 (rope_theta/rope_scaling) and 5."""
    family = model_family(name)
    rope = arch.rope
    rope_scaling = None
    max_positions = arch.max_seq_len
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
        "hidden_size": arch.dim,
        "intermediate_size": arch.ffn_hidden_dim,
        "num_hidden_layers": arch.n_layers,
        "num_attention_heads": arch.n_heads,
        "num_key_value_heads": arch.n_kv_heads,
        "head_dim": arch.head_dim,
        "vocab_size": arch.vocab_size,
        "max_position_embeddings": max_positions,
        "rms_norm_eps": arch.norm_eps,
        "tie_word_embeddings": arch.tie_embeddings,
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


def write_hf_config(out_dir: str, name: str, arch: Arch, dtype: torch.dtype) -> None:
    """``out_dir/config.json`` for a ``model.name=name`` decoder of shape ``arch`` with ``dtype`` weights."""
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(_hf_config_dict(name, arch, dtype), f, indent=2)
