"""The one-token decode step on plain (unsharded, non-DTensor) weights: the same arithmetic as the
decoder's sub-modules with a fraction of their per-token operators.

A decode step is launch/dispatch bound (a [B, D] activation through ~7 small GEMMs per layer), so what
costs is the operators and Python around the GEMMs, not the FLOPs. Against the module path
(``decode._cached_forward``) this step
- calls ``F.linear``/``F.rms_norm`` on the weights directly (no module call, FSDP hook or ``local_map``
  wrapper per sub-module);
- looks the RoPE table up once per step for all layers (``rope._reshape_cache``: a gather and a bounds
  check per layer before), then applies torchtitan's own ``apply_rotary_emb``, so every RoPE flavour's
  convention is the model's;
- runs the gate and up projections of the SwiGLU FFN (Shazeer 2020) as one GEMM on ``cat(w1, w3)``,
  concatenated once per generation;
- keeps the activation [B, D] (no sequence axis) and writes K/V straight into the cache's next slot.

``PlainStepWeights.of(model)`` is None where the step does not apply (TP's DTensor weights, MoE
layers, a decoder other than llama3/dense qwen3): decoding then takes the module path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor


@dataclass
class _Layer:
    attention: nn.Module          # GQAttention: rope, q_norm/k_norm, scaling, enable_gqa
    attn_norm: nn.Module          # RMSNorm modules: their weight and eps
    ffn_norm: nn.Module
    wqkv_W: torch.Tensor          # [(n_kv * (heads_per_kv + 2)) * head_dim, D], torchtitan's fused layout
    wo_W: torch.Tensor            # [D, n_heads * head_dim]
    w13_W: torch.Tensor           # [2 * F, D]: w1 (gate) rows then w3 (up) rows
    w2_W: torch.Tensor            # [D, F]


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
    def of(decoder: nn.Module) -> "PlainStepWeights | None":
        if any(isinstance(p, DTensor) for p in decoder.parameters()):
            return None
        layers = []
        for block in decoder.layers.values():
            att, ffn = getattr(block, "attention", None), getattr(block, "feed_forward", None)
            if (att is None or ffn is None or not hasattr(att, "qkv_linear") or not hasattr(att.qkv_linear, "wqkv")
                    or not all(hasattr(ffn, w) for w in ("w1", "w2", "w3"))
                    or not isinstance(block.attention_norm, nn.RMSNorm) or not isinstance(block.ffn_norm, nn.RMSNorm)):
                return None
            if any(getattr(m, "bias", None) is not None for m in (att.qkv_linear.wqkv, att.wo, ffn.w1, ffn.w2, ffn.w3)):
                return None
            layers.append(_Layer(att, block.attention_norm, block.ffn_norm, att.qkv_linear.wqkv.weight,
                                 att.wo.weight, torch.cat([ffn.w1.weight, ffn.w3.weight]), ffn.w2.weight))
        if not layers or not isinstance(decoder.norm, nn.RMSNorm) or getattr(decoder.lm_head, "bias", None) is not None:
            return None
        qkv = layers[0].attention.qkv_linear
        return PlainStepWeights(decoder.tok_embeddings.weight, layers, decoder.norm, decoder.lm_head.weight,
                                heads_per_kv=qkv.heads_per_kv, head_dim=qkv.head_dim)


def _rms_norm(x: torch.Tensor, norm: nn.RMSNorm) -> torch.Tensor:
    return F.rms_norm(x, norm.normalized_shape, norm.weight, norm.eps)


def plain_decode_step(w: PlainStepWeights, tokens_B: torch.Tensor, positions_B: torch.Tensor, state,
                      allowed_B1S: torch.Tensor | None = None) -> torch.Tensor:
    """One new token per row at ``positions_B``; appends its K/V to ``state``'s buffers and attends to
    every cached slot that ``allowed_B1S`` ([B, 1, S] bool, None: all) allows.

    tokens_B, positions_B: [B] long. Returns float32 logits [B, V] for the following token.
    """
    from refexp.titan.decode import _append_kv

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
        _append_kv(state, i, k_B1NH.transpose(1, 2), v_B1NH.transpose(1, 2))
        out_BN1H = F.scaled_dot_product_attention(q_B1NH.transpose(1, 2), state.keys[i], state.values[i],
                                                  attn_mask=None if allowed_B1S is None else allowed_B1S[:, None],
                                                  scale=att.scaling, enable_gqa=att.enable_gqa)
        h_BD = h_BD + F.linear(out_BN1H.reshape(B, -1), lw.wo_W)
        gate_BF, up_BF = F.linear(_rms_norm(h_BD, lw.ffn_norm), lw.w13_W).chunk(2, dim=-1)
        h_BD = h_BD + F.linear(F.silu(gate_BF) * up_BF, lw.w2_W)
    return F.linear(_rms_norm(h_BD, w.norm), w.lm_head_W).float()
