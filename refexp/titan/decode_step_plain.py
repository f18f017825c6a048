"""The one-token decode step on plain (unsharded, non-DTensor) weights: the decoder's sub-modules'
arithmetic with a fraction of their per-token operators (``plain_decode_step``), and its fixed-shape form
for CUDA graphs (``plain_static_step``, ``rollout.static_decode``; compiled per bucket in ``static_decode.py``).
``PlainStepWeights.of(model)`` is None where it does not apply (TP, MoE, a LoRA policy's adapted layers):
decoding then takes the module path. Why: docs/torchtitan-notes.md §16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from refexp.titan.kv_cache import append_kv
from refexp.titan.lora import has_adapters


@dataclass
class _Layer:
    attention: nn.Module          # GQAttention: rope, q_norm/k_norm, scaling, enable_gqa
    attn_norm: nn.Module          # RMSNorm modules: their weight and eps
    ffn_norm: nn.Module
    wqkv_W: torch.Tensor          # [(n_kv * (heads_per_kv + 2)) * head_dim, D], torchtitan's fused layout
    wo_W: torch.Tensor            # [D, n_heads * head_dim]
    w1_W: torch.Tensor            # [F, D] gate
    w3_W: torch.Tensor            # [F, D] up
    w2_W: torch.Tensor            # [D, F]
    w13_W: torch.Tensor | None    # [2 * F, D]: w1 rows then w3 rows (a copy, made when fused)


@dataclass
class PlainStepWeights:
    """What the one-token step reads, gathered once per generation (after FSDP's unshard)."""

    embedding: torch.Tensor       # [V, D]
    layers: list[_Layer]
    norm: nn.Module
    lm_head_W: torch.Tensor       # [V, D]
    heads_per_kv: int
    head_dim: int

    @staticmethod
    def of(decoder: nn.Module, *, fuse_ffn: bool = True) -> "PlainStepWeights | None":
        """``fuse_ffn``: concatenate w1 and w3 for one GEMM (a copy per generation; the fixed-shape step
        reads the parameters themselves, whose addresses a CUDA graph keeps)."""
        if any(isinstance(p, DTensor) for p in decoder.parameters()) or has_adapters(decoder):
            return None  # a LoRA policy decodes through its layers' forwards, adapters included
        layers = []
        for block in decoder.layers.values():
            att, ffn = getattr(block, "attention", None), getattr(block, "feed_forward", None)
            if (att is None or ffn is None or not hasattr(att, "qkv_linear") or not hasattr(att.qkv_linear, "wqkv")
                    or not all(hasattr(ffn, w) for w in ("w1", "w2", "w3"))
                    or not isinstance(block.attention_norm, nn.RMSNorm) or not isinstance(block.ffn_norm, nn.RMSNorm)):
                return None
            if any(getattr(m, "bias", None) is not None for m in (att.qkv_linear.wqkv, att.wo, ffn.w1, ffn.w2, ffn.w3)):
                return None
            layers.append(_Layer(att, block.attention_norm, block.ffn_norm, att.qkv_linear.wqkv.weight, att.wo.weight,
                                 ffn.w1.weight, ffn.w3.weight, ffn.w2.weight,
                                 torch.cat([ffn.w1.weight, ffn.w3.weight]) if fuse_ffn else None))
        if not layers or not isinstance(decoder.norm, nn.RMSNorm) or getattr(decoder.lm_head, "bias", None) is not None:
            return None
        qkv = layers[0].attention.qkv_linear
        return PlainStepWeights(decoder.tok_embeddings.weight, layers, decoder.norm, decoder.lm_head.weight,
                                heads_per_kv=qkv.heads_per_kv, head_dim=qkv.head_dim)


def _rms_norm(x: torch.Tensor, norm: nn.RMSNorm) -> torch.Tensor:
    return F.rms_norm(x, norm.normalized_shape, norm.weight, norm.eps)


def _ffn(lw: _Layer, x_BD: torch.Tensor) -> torch.Tensor:
    """SwiGLU: w2(silu(w1 x) * w3 x), with w1 and w3 as one GEMM where they were concatenated."""
    if lw.w13_W is not None:
        gate_BF, up_BF = F.linear(x_BD, lw.w13_W).chunk(2, dim=-1)
    else:
        gate_BF, up_BF = F.linear(x_BD, lw.w1_W), F.linear(x_BD, lw.w3_W)
    return F.linear(F.silu(gate_BF) * up_BF, lw.w2_W)


def _forward_one_token(w: PlainStepWeights, tokens_B: torch.Tensor, positions_B: torch.Tensor, attend) -> torch.Tensor:
    """The decoder over one new token per row; ``attend(layer, attention, q_B1NH, k_B1NH, v_B1NH)`` stores the
    layer's new keys/values and returns the attention output [B, n_heads, 1, head_dim]. Float32 logits [B, V]."""
    B = tokens_B.shape[0]
    hpk, hd = w.heads_per_kv, w.head_dim
    h_BD = F.embedding(tokens_B, w.embedding)
    rope_cache = None
    for i, lw in enumerate(w.layers):
        att = lw.attention
        qkv = F.linear(_rms_norm(h_BD, lw.attn_norm), lw.wqkv_W).view(B, 1, -1, hpk + 2, hd)
        q_B1NH = qkv[:, :, :, :hpk].reshape(B, 1, -1, hd)   # heads ordered (kv group, head in group)
        k_B1NH, v_B1NH = qkv[:, :, :, hpk], qkv[:, :, :, hpk + 1]
        if att.q_norm is not None:  # qwen3: QK-norm before RoPE, as GQAttention.forward
            q_B1NH, k_B1NH = att.q_norm(q_B1NH), att.k_norm(k_B1NH)
        if rope_cache is None:  # the same positions in every layer
            rope_cache = att.rope._reshape_cache(q_B1NH, positions_B[:, None])
        q_B1NH, k_B1NH = att.rope.apply_rotary_emb(q_B1NH, k_B1NH, rope_cache)
        out_BN1H = attend(i, att, q_B1NH, k_B1NH, v_B1NH)
        h_BD = h_BD + F.linear(out_BN1H.reshape(B, -1), lw.wo_W)
        h_BD = h_BD + _ffn(lw, _rms_norm(h_BD, lw.ffn_norm))
    return F.linear(_rms_norm(h_BD, w.norm), w.lm_head_W).float()


def plain_decode_step(w: PlainStepWeights, tokens_B: torch.Tensor, positions_B: torch.Tensor, state,
                      allowed_B1S: torch.Tensor | None = None) -> torch.Tensor:
    """One new token per row at ``positions_B``; appends its K/V to ``state``'s buffers and attends to
    every cached slot that ``allowed_B1S`` ([B, 1, S] bool, None: all) allows.

    tokens_B, positions_B: [B] long. Returns float32 logits [B, V] for the following token.
    """
    mask = None if allowed_B1S is None else allowed_B1S[:, None]

    def attend(i, att, q_B1NH, k_B1NH, v_B1NH):
        append_kv(state, i, k_B1NH.transpose(1, 2), v_B1NH.transpose(1, 2))
        return F.scaled_dot_product_attention(q_B1NH.transpose(1, 2), state.keys[i], state.values[i], attn_mask=mask,
                                              scale=att.scaling, enable_gqa=att.enable_gqa)

    return _forward_one_token(w, tokens_B, positions_B, attend)


def plain_static_step(w: PlainStepWeights, tokens_B: torch.Tensor, positions_B: torch.Tensor, slot_1: torch.Tensor,
                      key_bufs: list[torch.Tensor], value_bufs: list[torch.Tensor],
                      allowed_BC: torch.Tensor) -> torch.Tensor:
    """``plain_decode_step`` with fixed shapes: the new token's keys/values go to slot ``slot_1`` ([1] long,
    on the device) of every layer's [B, n_kv, C, head_dim] buffer, the slot is marked in ``allowed_BC``
    ([B, C] bool: the slots a query may see; in place), and attention reads all C slots under that mask.
    Unfilled slots must hold finite values (the buffers are zero-initialised). Returns float32 logits [B, V].
    """
    allowed_BC.index_fill_(1, slot_1, True)
    mask_B11C = allowed_BC[:, None, None, :]

    def attend(i, att, q_B1NH, k_B1NH, v_B1NH):
        key_bufs[i].index_copy_(2, slot_1, k_B1NH.transpose(1, 2))
        value_bufs[i].index_copy_(2, slot_1, v_B1NH.transpose(1, 2))
        return F.scaled_dot_product_attention(q_B1NH.transpose(1, 2), key_bufs[i], value_bufs[i], attn_mask=mask_B11C,
                                              scale=att.scaling, enable_gqa=att.enable_gqa)

    return _forward_one_token(w, tokens_B, positions_B, attend)
