"""A tiny llama GGUF file written with the ``gguf`` package, shaped like SmolLM2's: no ``output.weight``, so the
output layer is the token embedding (transformers' GGUF reader then sets ``tie_word_embeddings``), float32 tensors,
and a byte-level BPE vocabulary of 40 tokens. The tied-embedding path (refexp/components/gguf_to_hf.py, then
torchtitan's llama3) is checked on it where SmolLM2's wheel cannot be fetched."""

from __future__ import annotations

from pathlib import Path

import numpy as np

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def tied_llama_gguf(path: str | Path, *, dim: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                    ffn: int = 64, seed: int = 0) -> Path:
    """Write the GGUF file ``path`` (weights N(0, 0.2), norms near 1: logits far from uniform); returns it."""
    import gguf

    rng = np.random.default_rng(seed)
    tokens = SPECIALS + [chr(c) for c in range(ord("a"), ord("a") + 36)] + ["ab"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(64)
    w.add_embedding_length(dim)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL] * len(SPECIALS) + [gguf.TokenType.NORMAL] * (len(tokens) - 3))
    w.add_token_merges(["a b"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    def norm() -> np.ndarray:
        return (1.0 + weight(dim)).astype(np.float32)

    head_dim = dim // heads
    w.add_tensor("token_embd.weight", weight(len(tokens), dim))  # and no output.weight: tied
    w.add_tensor("output_norm.weight", norm())
    for i in range(layers):
        for name, shape in (("attn_q", (dim, dim)), ("attn_k", (kv_heads * head_dim, dim)),
                            ("attn_v", (kv_heads * head_dim, dim)), ("attn_output", (dim, dim)),
                            ("ffn_gate", (ffn, dim)), ("ffn_up", (ffn, dim)), ("ffn_down", (dim, ffn))):
            w.add_tensor(f"blk.{i}.{name}.weight", weight(*shape))
        w.add_tensor(f"blk.{i}.attn_norm.weight", norm())
        w.add_tensor(f"blk.{i}.ffn_norm.weight", norm())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)
