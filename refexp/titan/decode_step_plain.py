"""The one-token decode step on plain (unsharded, non-DTensor) weights: the decoder's sub-modules'
arithmetic with a fraction of their per-token operators (``plain_decode_step``), and its fixed-shape form
for CUDA graphs (``plain_static_step``, ``rollout.static_decode``; compiled per bucket in ``static_decode.py``).
A LoRA policy's adapted layers are read in the view they are in when the weights are gathered
(``lora.low_rank_in_view``: the adapters in the policy view, none in the base view): each computes
``W x + scale * B (A x)`` on the parameters themselves, never a merged copy of ``W``. The fixed-shape step does
not take adapters (``decode._prefill_static`` refuses them). ``PlainStepWeights.of(model)`` is None where the
step does not apply (TP, MoE, the reference view of a dense EMA delta): decoding then takes the module path.
Why: docs/torchtitan-notes.md §16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from refexp.titan.kv_cache import append_kv
from refexp.titan.lora import low_rank_in_view


@dataclass
class LowRank:
    """What an adapter adds to a linear layer's output: ``scale * B (A x)``."""

    A: torch.Tensor               # [r, in]
    B: torch.Tensor               # [out, r]
    scale: float


def _low_rank(linear: nn.Module) -> LowRank | None:
    part = low_rank_in_view(linear)
    return None if part is None else LowRank(*part)


def _fused_low_rank(w1: LowRank | None, w3: LowRank | None, ffn_dim: int) -> LowRank | None:
    """w1's and w3's adapters as one for the fused [2F, D] GEMM: A's stacked [r1 + r3, D] and B's block-diagonal
    [2F, r1 + r3] (copies of the adapters' size, zeros off the blocks), so the low-rank part is two GEMMs too."""
    if w1 is None and w3 is None:
        return None
    like = w1 or w3
    none_A, none_B = like.A.new_zeros(0, like.A.shape[1]), like.B.new_zeros(ffn_dim, 0)
    return LowRank(torch.cat([w1.A if w1 else none_A, w3.A if w3 else none_A]),
                   torch.block_diag(w1.B if w1 else none_B, w3.B if w3 else none_B), like.scale)


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
    # the adapters' parts in the gathered view (None: the layer adds nothing to W x)
    wqkv_lr: LowRank | None = None
    wo_lr: LowRank | None = None
    w1_lr: LowRank | None = None
    w3_lr: LowRank | None = None
    w2_lr: LowRank | None = None
    w13_lr: LowRank | None = None  # w1's and w3's, for w13_W


@dataclass
class PlainStepWeights:
    """What the one-token step reads, gathered once per generation (after FSDP's unshard)."""

    embedding: torch.Tensor       # [V, D]
    layers: list[_Layer]
    norm: nn.Module
    lm_head_W: torch.Tensor       # [V, D]
    heads_per_kv: int
    head_dim: int
    lm_head_lr: LowRank | None = None

    @property
    def adapted(self) -> bool:
        """Whether some layer adds an adapter's part (LoRA's policy view, or the reference view of an adapter)."""
        parts = [self.lm_head_lr] + [p for lw in self.layers for p in (lw.wqkv_lr, lw.wo_lr, lw.w1_lr, lw.w3_lr,
                                                                      lw.w2_lr)]
        return any(p is not None for p in parts)

    @staticmethod
    def of(decoder: nn.Module, *, fuse_ffn: bool = True) -> "PlainStepWeights | None":
        """``fuse_ffn``: concatenate w1 and w3 for one GEMM (a copy per generation; the fixed-shape step
        reads the parameters themselves, whose addresses a CUDA graph keeps). Adapted layers are read in their
        current view: gather inside the view the generation decodes in."""
        if any(isinstance(p, DTensor) for p in decoder.parameters()):
            return None
        try:
            return PlainStepWeights._gather(decoder, fuse_ffn)
        except NotImplementedError:  # an adapted layer whose view adds a dense delta: its forward computes it
            return None

    @staticmethod
    def _gather(decoder: nn.Module, fuse_ffn: bool) -> "PlainStepWeights | None":
        layers = []
        for block in decoder.layers.values():
            att, ffn = getattr(block, "attention", None), getattr(block, "feed_forward", None)
            if (att is None or ffn is None or not hasattr(att, "qkv_linear") or not hasattr(att.qkv_linear, "wqkv")
                    or not all(hasattr(ffn, w) for w in ("w1", "w2", "w3"))
                    or not isinstance(block.attention_norm, nn.RMSNorm) or not isinstance(block.ffn_norm, nn.RMSNorm)):
                return None
            if any(getattr(m, "bias", None) is not None for m in (att.qkv_linear.wqkv, att.wo, ffn.w1, ffn.w2, ffn.w3)):
                return None
            w1_lr, w3_lr = _low_rank(ffn.w1), _low_rank(ffn.w3)
            fuse = fuse_ffn and (w1_lr is None or w3_lr is None or w1_lr.scale == w3_lr.scale)
            layers.append(_Layer(att, block.attention_norm, block.ffn_norm, att.qkv_linear.wqkv.weight, att.wo.weight,
                                 ffn.w1.weight, ffn.w3.weight, ffn.w2.weight,
                                 torch.cat([ffn.w1.weight, ffn.w3.weight]) if fuse else None,
                                 _low_rank(att.qkv_linear.wqkv), _low_rank(att.wo), w1_lr, w3_lr, _low_rank(ffn.w2),
                                 _fused_low_rank(w1_lr, w3_lr, ffn.w1.weight.shape[0]) if fuse else None))
        if not layers or not isinstance(decoder.norm, nn.RMSNorm) or getattr(decoder.lm_head, "bias", None) is not None:
            return None
        qkv = layers[0].attention.qkv_linear
        return PlainStepWeights(decoder.tok_embeddings.weight, layers, decoder.norm, decoder.lm_head.weight,
                                heads_per_kv=qkv.heads_per_kv, head_dim=qkv.head_dim,
                                lm_head_lr=_low_rank(decoder.lm_head))


def _rms_norm(x: torch.Tensor, norm: nn.RMSNorm) -> torch.Tensor:
    return F.rms_norm(x, norm.normalized_shape, norm.weight, norm.eps)


def _linear(x_BI: torch.Tensor, W_OI: torch.Tensor, lr: LowRank | None) -> torch.Tensor:
    """``x W^T``, plus the adapter's ``scale * (x A^T) B^T`` where there is one ([B, in] -> [B, out]); the scale
    and the sum are one ``addmm``."""
    y_BO = F.linear(x_BI, W_OI)
    if lr is None:
        return y_BO
    return torch.addmm(y_BO, F.linear(x_BI, lr.A), lr.B.t(), alpha=lr.scale)


def _ffn(lw: _Layer, x_BD: torch.Tensor) -> torch.Tensor:
    """SwiGLU: w2(silu(w1 x) * w3 x), with w1 and w3 as one GEMM where they were concatenated."""
    if lw.w13_W is not None:
        gate_BF, up_BF = _linear(x_BD, lw.w13_W, lw.w13_lr).chunk(2, dim=-1)
    else:
        gate_BF, up_BF = _linear(x_BD, lw.w1_W, lw.w1_lr), _linear(x_BD, lw.w3_W, lw.w3_lr)
    return _linear(F.silu(gate_BF) * up_BF, lw.w2_W, lw.w2_lr)


def _forward_one_token(w: PlainStepWeights, tokens_B: torch.Tensor, positions_B: torch.Tensor, attend) -> torch.Tensor:
    """The decoder over one new token per row; ``attend(layer, attention, q_B1NH, k_B1NH, v_B1NH)`` stores the
    layer's new keys/values and returns the attention output [B, n_heads, 1, head_dim]. Float32 logits [B, V]."""
    B = tokens_B.shape[0]
    hpk, hd = w.heads_per_kv, w.head_dim
    h_BD = F.embedding(tokens_B, w.embedding)
    rope_cache = None
    for i, lw in enumerate(w.layers):
        att = lw.attention
        qkv = _linear(_rms_norm(h_BD, lw.attn_norm), lw.wqkv_W, lw.wqkv_lr).view(B, 1, -1, hpk + 2, hd)
        q_B1NH = qkv[:, :, :, :hpk].reshape(B, 1, -1, hd)   # heads ordered (kv group, head in group)
        k_B1NH, v_B1NH = qkv[:, :, :, hpk], qkv[:, :, :, hpk + 1]
        if att.q_norm is not None:  # qwen3: QK-norm before RoPE, as GQAttention.forward
            q_B1NH, k_B1NH = att.q_norm(q_B1NH), att.k_norm(k_B1NH)
        if rope_cache is None:  # the same positions in every layer
            rope_cache = att.rope._reshape_cache(q_B1NH, positions_B[:, None])
        q_B1NH, k_B1NH = att.rope.apply_rotary_emb(q_B1NH, k_B1NH, rope_cache)
        out_BN1H = attend(i, att, q_B1NH, k_B1NH, v_B1NH)
        h_BD = h_BD + _linear(out_BN1H.reshape(B, -1), lw.wo_W, lw.wo_lr)
        h_BD = h_BD + _ffn(lw, _rms_norm(h_BD, lw.ffn_norm))
    return _linear(_rms_norm(h_BD, w.norm), w.lm_head_W, w.lm_head_lr).float()


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
