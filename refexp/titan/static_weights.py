"""Fixed-address weights for the fixed-shape decode step (``rollout.static_decode``) of an FSDP-wrapped model.

Why: a CUDA graph reads its inputs at the addresses it recorded them at. FSDP2 frees an unsharded parameter's
storage when it reshards and allocates it anew at the next unshard (``torch.distributed.fsdp._fully_shard``:
``FSDPParam.free_unsharded_param`` / ``alloc_all_gather_outputs``), so the weights ``titan.prefill`` gathers for
each generation sit at other addresses whenever the allocator hands out other blocks — after a training step
between two generations, typically. cudagraph trees then record the graph again (or, past
``cudagraph_unexpected_rerecord_limit``, stop using it). Here each generation copies the gathered weights into
tensors allocated once per model (``mark_static_address`` on CUDA) and the step reads those: the step's weight
inputs keep their addresses for the whole run. The copy is what the decoding needs anyway (the whole model in
the compute dtype), held between generations instead of only during them; ``titan.prefill(static=True)``
reshards the FSDP modules as soon as the prompts are prefilled, so a generation holds one full copy, not two.
A model that is not FSDP-wrapped needs none of this: its parameters are updated in place and never move.
"""

from __future__ import annotations

import dataclasses
import weakref

import torch
import torch.nn as nn

from refexp.titan.decode_step_plain import PlainStepWeights, _Layer


@dataclasses.dataclass
class _Attention:
    """What the step reads of a GQAttention (``decode_step_plain._forward_one_token``), with its QK-norms'
    weights at fixed addresses; ``rope`` is the module's own (its table is a buffer FSDP does not shard)."""

    q_norm: nn.Module | None
    k_norm: nn.Module | None
    rope: nn.Module
    scaling: float | None
    enable_gqa: bool


_KEPT: "weakref.WeakKeyDictionary[nn.Module, PlainStepWeights]" = weakref.WeakKeyDictionary()


def _buffer(like: torch.Tensor) -> torch.Tensor:
    t = torch.empty_like(like, memory_format=torch.contiguous_format)
    if t.is_cuda:
        torch._dynamo.mark_static_address(t)
    return t


def _norm(norm: nn.Module | None) -> nn.Module | None:
    """An ``nn.RMSNorm`` of ``norm``'s shape and eps with its own weight buffer (None stays None)."""
    if norm is None:
        return None
    out = nn.RMSNorm(norm.normalized_shape, eps=norm.eps, elementwise_affine=True, device="meta")
    out.weight = nn.Parameter(_buffer(norm.weight), requires_grad=False)
    return out


def _allocate(w: PlainStepWeights) -> PlainStepWeights:
    layers = [_Layer(_Attention(_norm(lw.attention.q_norm), _norm(lw.attention.k_norm), lw.attention.rope,
                                lw.attention.scaling, lw.attention.enable_gqa),
                     _norm(lw.attn_norm), _norm(lw.ffn_norm), _buffer(lw.wqkv_W), _buffer(lw.wo_W), _buffer(lw.w1_W),
                     _buffer(lw.w3_W), _buffer(lw.w2_W), None) for lw in w.layers]
    return PlainStepWeights(_buffer(w.embedding), layers, _norm(w.norm), _buffer(w.lm_head_W),
                            heads_per_kv=w.heads_per_kv, head_dim=w.head_dim)


def _pairs(kept: PlainStepWeights, w: PlainStepWeights):
    """(kept tensor, gathered tensor) for every weight the step reads."""
    yield kept.embedding, w.embedding
    yield kept.lm_head_W, w.lm_head_W
    yield kept.norm.weight, w.norm.weight
    for k, g in zip(kept.layers, w.layers, strict=True):
        yield from ((k.wqkv_W, g.wqkv_W), (k.wo_W, g.wo_W), (k.w1_W, g.w1_W), (k.w3_W, g.w3_W), (k.w2_W, g.w2_W),
                    (k.attn_norm.weight, g.attn_norm.weight), (k.ffn_norm.weight, g.ffn_norm.weight))
        for kn, gn in ((k.attention.q_norm, g.attention.q_norm), (k.attention.k_norm, g.attention.k_norm)):
            if gn is not None:
                yield kn.weight, gn.weight


def _fits(kept: PlainStepWeights, w: PlainStepWeights) -> bool:
    if len(kept.layers) != len(w.layers):
        return False
    return all(k.shape == g.shape and k.dtype == g.dtype and k.device == g.device for k, g in _pairs(kept, w))


@torch.no_grad()
def stable_step_weights(decoder: nn.Module, gathered: PlainStepWeights) -> PlainStepWeights:
    """``gathered`` (the weights FSDP just unsharded) copied into ``decoder``'s kept tensors, made at the first
    call (and again should the shapes or dtypes change); the step reads the returned copy."""
    kept = _KEPT.get(decoder)
    if kept is None or not _fits(kept, gathered):
        kept = _KEPT[decoder] = _allocate(gathered)
    for k, g in _pairs(kept, gathered):
        k.copy_(g)
    return kept


def release_static_weights() -> None:
    """Drop every model's kept weights (``release_static_buckets`` calls it)."""
    _KEPT.clear()
