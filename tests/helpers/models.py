"""Tiny torchtitan model configs: real llama3 / qwen3 code at shapes that run in milliseconds on CPU."""

from __future__ import annotations

from refexp.config import ModelConfig


def tiny_model_config(name: str = "llama3", **overrides) -> ModelConfig:
    """torchtitan's ``debugmodel`` flavor at dim 64, 2 layers, 4 heads (2 KV heads: GQA), a RoPE table of 64;
    ``overrides`` (``vocab_size`` among them) set or replace any field."""
    fields = dict(name=name, flavor="debugmodel", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64)
    return ModelConfig(**{**fields, **overrides})
