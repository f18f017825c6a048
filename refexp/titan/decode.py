"""KV-cache decoding of left-padded prompts: ``prefill``, ``decode_step``, ``repeat_decode_rows``,
``finish_decode`` (and ``compiles_next_step`` for fixed-shape decoding, ``static_decode.py``).

The cache is built from the decoder's own sub-modules (llama3, dense qwen3) rather than torchtitan's
forward, which has no cache. Under TP the sub-modules keep doing their own redistribution (torchtitan
0.3.0 wraps each parallelized module's ``forward``; docs/torchtitan-notes.md §14): attention runs on
this rank's heads, so each rank caches the keys/values of its own heads only, and ``wo``'s row-parallel
reduction happens inside ``wo``.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Replicate, Shard

from refexp.titan.decode_step_plain import PlainStepWeights, plain_decode_step
from refexp.titan.kv_cache import DecodeState, append_kv
from refexp.titan.logprobs import vocab_shard_mesh_dim
from refexp.titan.static_decode import bucket_rows, static_bucket
from refexp.titan.static_weights import stable_step_weights
from refexp.titan.unwrap import decoder_of, local_tensor


def _unshard_for_decoding(model: nn.Module) -> list[nn.Module]:
    """Unshard every FSDP module (a collective: every rank must decode) so that its sub-modules hold
    full weights; ``finish_decode`` reshards them."""
    from torch.distributed.fsdp import FSDPModule

    fsdp_modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in fsdp_modules:
        m.unshard()
    return fsdp_modules


def _call_without_hooks(module: nn.Module, *args):
    """``module.forward`` directly: FSDP's pre/post-forward hooks would reshard what we unsharded."""
    return module.forward(*args)


def _replicated(x: torch.Tensor) -> torch.Tensor:
    """A DTensor redistributed to Replicate (TP's sequence-parallel activations gathered); plain tensors
    pass through."""
    if not isinstance(x, DTensor):
        return x
    return x.redistribute(x.device_mesh, [Replicate()] * x.device_mesh.ndim)


def _like(local: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``local`` as a DTensor laid out like ``ref`` (this rank's heads of a head-sharded tensor), or
    ``local`` itself when ``ref`` is plain."""
    if not isinstance(ref, DTensor):
        return local
    return DTensor.from_local(local, ref.device_mesh, ref.placements, run_check=False)


def _attend(attention: nn.Module, x_BLD: torch.Tensor, positions_BL: torch.Tensor, state: DecodeState,
            layer: int, allowed_BLS: torch.Tensor | None) -> torch.Tensor:
    """GQAttention's forward with the layer's keys/values appended to the cache.

    ``allowed_BLS`` is the explicit mask (query, slot); None when no row is padded: then the new
    tokens see every cached slot and each other causally (SDPA's ``is_causal`` for a first block,
    no mask at all for one new token). Under TP, q/k/v come out of ``qkv_linear`` sharded over heads;
    the cache and SDPA work on the local heads (as GQAttention's inner attention does), and ``wo``
    (row-parallel) sums the heads' contributions over TP ranks.
    """
    # GQAttention's own input redistribution: every head needs the whole sequence.
    q_BLNH, k_BLNH, v_BLNH = attention.qkv_linear(_replicated(x_BLD))
    if attention.q_norm is not None:  # qwen3: QK-norm before RoPE, as GQAttention.forward
        q_BLNH, k_BLNH = attention.q_norm(q_BLNH), attention.k_norm(k_BLNH)
    q_BLNH, k_BLNH = attention.rope(q_BLNH, k_BLNH, positions_BL)
    q_sharded = q_BLNH
    q_BLNH, k_BLNH, v_BLNH = local_tensor(q_BLNH), local_tensor(k_BLNH), local_tensor(v_BLNH)  # this rank's heads
    B, L = q_BLNH.shape[:2]
    start = append_kv(state, layer, k_BLNH.transpose(1, 2), v_BLNH.transpose(1, 2))
    is_causal = False
    if allowed_BLS is None and L > 1:
        if start == 0:
            is_causal = True
        else:  # several new tokens after a cache: causal among themselves, all cached slots visible
            S = start + L
            allowed_BLS = (torch.arange(S, device=q_BLNH.device)[None, :]
                           <= torch.arange(start, S, device=q_BLNH.device)[:, None]).expand(B, L, S)
    out_BNLH = F.scaled_dot_product_attention(
        q_BLNH.transpose(1, 2), state.keys[layer], state.values[layer],
        attn_mask=None if allowed_BLS is None else allowed_BLS.unsqueeze(1), is_causal=is_causal,
        scale=attention.scaling, enable_gqa=attention.enable_gqa,
    )
    out_BLNH = _like(out_BNLH.transpose(1, 2).contiguous(), q_sharded)
    return attention.wo(out_BLNH.flatten(2))


def _last_position_logits(out_BLV: torch.Tensor) -> torch.Tensor:
    """Float32 logits [B, V] at the last position of [B, L, V] logits; a vocab-sharded DTensor (TP) is
    indexed locally and only those [B, V] are gathered."""
    if not isinstance(out_BLV, DTensor):
        return out_BLV[:, -1].float()
    mesh_dim = vocab_shard_mesh_dim(out_BLV)
    last_Bv = out_BLV.to_local()[:, -1]
    placements = [Replicate()] * out_BLV.device_mesh.ndim
    placements[mesh_dim] = Shard(1)
    B, V = last_Bv.shape[0], out_BLV.shape[-1]  # global V: shards may be uneven
    last_BV = DTensor.from_local(last_Bv, out_BLV.device_mesh, placements, run_check=False, shape=(B, V),
                                 stride=(V, 1))
    return last_BV.full_tensor().float()


def _cached_forward(model: nn.Module, tokens_BL: torch.Tensor, positions_BL: torch.Tensor,
                    state: DecodeState, allowed_BLS: torch.Tensor | None) -> torch.Tensor:
    """The decoder's forward over new tokens, attending to cached keys; last-position logits [B, V]."""
    dec = decoder_of(model)
    h = _call_without_hooks(dec.tok_embeddings, tokens_BL)
    for i, block in enumerate(dec.layers.values()):
        h = h + _attend(block.attention, block.attention_norm(h), positions_BL, state, i, allowed_BLS)
        h = h + block.feed_forward(block.ffn_norm(h))
    # Only the last position is projected onto the vocabulary. Under TP it goes back to h's own layout
    # (sequence-parallel Shard(1), even for one position), which the final norm requires of its input.
    h_B1D = _replicated(h)[:, -1:]
    if isinstance(h, DTensor):
        h_B1D = h_B1D.redistribute(h.device_mesh, h.placements)
    return _last_position_logits(_call_without_hooks(dec.lm_head, _call_without_hooks(dec.norm, h_B1D)))


@torch.no_grad()
def prefill(model: nn.Module, prompt_BL: torch.LongTensor, prompt_lens_B: torch.LongTensor, *,
            max_new_tokens: int = 0, static: bool = False, capacity: int | None = None,
            rows_B: torch.LongTensor | None = None):
    """Start incremental decoding of left-padded prompts: returns (last_logits_BV float32, state).

    ``prompt_BL`` is left-padded to a common length L; row b's real tokens are its last
    ``prompt_lens_B[b]`` columns. Positions start at 0 at each row's first real token; pad keys are
    masked. Builds a KV cache out of the decoder's own sub-modules (llama3, dense qwen3). Under FSDP2
    the FSDP modules are unsharded until ``finish_decode``; under TP each rank caches its own heads.
    Collective under FSDP/TP: every rank must decode the same number of steps.
    ``max_new_tokens``: decode steps to reserve cache slots for (more still fit: the cache grows).
    ``static``: fixed-shape decode steps (``static_decode.py``) over a kept bucket of
    ``bucket_rows(len(rows_B))`` rows and ``capacity`` slots (None: L + ``max_new_tokens``; a fixed value
    keeps one compiled step per row bucket whatever the prompts' lengths): at most ``capacity - L`` steps;
    needs plain weights (not TP). ``rows_B`` (static only): decode row b continues prompt ``rows_B[b]``
    (``repeat_decode_rows`` in one go; None: one row per prompt). The logits stay per prompt [B, V].
    """
    if static:
        return _prefill_static(model, prompt_BL, prompt_lens_B, max_new_tokens, capacity, rows_B)
    if rows_B is not None or capacity is not None:
        raise ValueError("prefill(): rows_B and capacity are for static=True")
    return _prefill(model, prompt_BL, prompt_lens_B, max_new_tokens, fuse_ffn=True)


def _prefill(model: nn.Module, prompt_BL: torch.Tensor, prompt_lens_B: torch.Tensor, max_new_tokens: int, *,
             fuse_ffn: bool):
    L = prompt_BL.shape[1]
    lens_B = prompt_lens_B.to(prompt_BL.device)
    slots_L = torch.arange(L, device=prompt_BL.device)
    first_B1 = (L - lens_B)[:, None]  # slot of each row's first real token
    valid_BL = slots_L >= first_B1
    positions_BL = (slots_L - first_B1).clamp(min=0)
    state = DecodeState(tokens_BS=prompt_BL.clone(), valid_BS=valid_BL, next_pos_B=lens_B.clone(),
                        capacity=L + max(0, int(max_new_tokens)), padded=bool((lens_B < L).any()))
    state.unsharded = _unshard_for_decoding(model)
    # the unsharded weights, where they are plain tensors
    state.plain = PlainStepWeights.of(decoder_of(model), fuse_ffn=fuse_ffn)
    if not state.padded:  # plain causal attention, no mask to build or apply
        return _cached_forward(model, prompt_BL, positions_BL, state, None), state
    # Query i sees real keys j <= i; pad queries see themselves only (their output is never used,
    # but an all-masked row would be NaN).
    causal_LL = slots_L[None, :] <= slots_L[:, None]
    allowed_BLL = (causal_LL & valid_BL[:, None, :]) | torch.eye(L, dtype=torch.bool, device=prompt_BL.device)
    return _cached_forward(model, prompt_BL, positions_BL, state, allowed_BLL), state


def _prefill_static(model: nn.Module, prompt_BL: torch.Tensor, prompt_lens_B: torch.Tensor, max_new_tokens: int,
                    capacity: int | None, rows_B: torch.Tensor | None):
    """``prefill(static=True)``: the prompts' keys/values (an ordinary prefill, exactly L slots) copied into
    a kept bucket's buffers; its padding rows and the slots no row has filled yet are masked out."""
    L = prompt_BL.shape[1]
    capacity = L + max(0, int(max_new_tokens)) if capacity is None else int(capacity)
    if capacity < L + max_new_tokens:
        raise ValueError(f"prefill(static=True): capacity={capacity} slots is invalid for prompts of {L} tokens and "
                         f"{max_new_tokens} new tokens: expected at least {L + max_new_tokens}")
    # the fixed-shape step reads the parameters themselves (fixed addresses), not a concatenated w1/w3 copy
    logits_UV, pre = _prefill(model, prompt_BL, prompt_lens_B, 0, fuse_ffn=False)
    if pre.plain is None:
        finish_decode(pre)
        raise ValueError("prefill(static=True) needs plain weights; this model's are DTensors (tensor "
                         "parallel): decode with static=False")
    if pre.plain.adapted:  # the kept weights (static_weights.py) and the compiled step's inputs hold no adapters
        finish_decode(pre)
        raise ValueError("prefill(static=True) does not decode LoRA adapters (the fixed-shape step's kept weights are "
                         "the base's): decode with static=False, or in the base view")
    if pre.unsharded:  # FSDP: the step reads a kept copy at fixed addresses (static_weights.py), not the
        # parameters FSDP gathered, whose storage moves between generations; the gathered ones go at once
        pre.plain = stable_step_weights(decoder_of(model), pre.plain)
        for m in pre.unsharded:
            m.reshard()
        pre.unsharded = []
    rows_B = torch.arange(len(prompt_BL), device=prompt_BL.device) if rows_B is None else rows_B.to(prompt_BL.device)
    n = len(rows_B)
    try:
        bucket = static_bucket(pre.key_bufs[0], len(pre.key_bufs), bucket_rows(n), capacity)
    except BaseException:
        finish_decode(pre)
        raise
    for src, dst in ((pre.key_bufs, bucket.key_bufs), (pre.value_bufs, bucket.value_bufs)):
        for s, d in zip(src, dst):
            d[:n, :, :L].copy_(s[rows_B, :, :L])
    # Stale keys/values of an earlier generation stay in the other slots and rows: finite, and masked here.
    # Padding rows see only the slots their own (discarded) tokens fill, so no row's attention is all-masked.
    bucket.allowed_RC.zero_()
    bucket.allowed_RC[:n, :L] = pre.valid_BS[rows_B]
    bucket.next_pos_R.zero_()
    bucket.next_pos_R[:n] = pre.next_pos_B[rows_B]
    bucket.slot_1.fill_(L)
    bucket.tokens_R.zero_()
    state = DecodeState(tokens_BS=pre.tokens_BS[rows_B], valid_BS=pre.valid_BS[rows_B],
                        next_pos_B=bucket.next_pos_R[:n], unsharded=pre.unsharded, capacity=capacity, filled=L,
                        key_bufs=bucket.key_bufs, value_bufs=bucket.value_bufs, padded=pre.padded, plain=pre.plain,
                        static=True, bucket=bucket)
    pre.unsharded = []  # now owned by ``state``: finish_decode(state) reshards
    return logits_UV, state


def compiles_next_step(state: DecodeState) -> bool:
    """True when ``state``'s next ``decode_step`` is its bucket's first (where a compiled step compiles)."""
    return bool(state.static and state.bucket.compiles_next_call)


@torch.no_grad()
def decode_step(model: nn.Module, next_tokens_B: torch.LongTensor, state: DecodeState):
    """Append one token per row; returns (logits_BV float32 for the following token, state)."""
    tokens_B1 = next_tokens_B.reshape(-1, 1).to(state.next_pos_B.device)
    if state.static:
        return _static_decode_step(tokens_B1[:, 0], state), state
    positions_B = state.next_pos_B
    state.next_pos_B = positions_B + 1
    allowed_B1S = None
    if state.padded:
        state.valid_BS = torch.cat([state.valid_BS, torch.ones_like(tokens_B1, dtype=torch.bool)], dim=1)
        allowed_B1S = state.valid_BS[:, None, :]
    if state.plain is not None:
        return plain_decode_step(state.plain, tokens_B1[:, 0], positions_B, state, allowed_B1S), state
    return _cached_forward(model, tokens_B1, positions_B[:, None], state, allowed_B1S), state


def _static_decode_step(tokens_B: torch.Tensor, state: DecodeState) -> torch.Tensor:
    if state.filled >= state.capacity:
        raise ValueError(f"decode_step: the fixed-shape cache's {state.capacity} slots are full (prefill's capacity)")
    logits_BV = state.bucket.run(state.plain, tokens_B)  # next_pos_B is a view of the bucket's: advanced there
    state.filled += 1  # host-side bookkeeping only (no device read, no per-layer views)
    return logits_BV


def repeat_decode_rows(state: DecodeState, rows_B: torch.LongTensor) -> DecodeState:
    """A state whose row b continues ``state``'s row ``rows_B[b]`` (prefill each distinct prompt once,
    then decode G rows of it: GRPO's groups). Copies the filled cache slots; shares the FSDP unshard.
    Not for a fixed-shape state (its rows are fixed: ``prefill(static=True, rows_B=...)``)."""
    if state.static:
        raise ValueError("repeat_decode_rows(): a fixed-shape decode's rows are set at prefill (rows_B)")
    rows_B = rows_B.to(state.tokens_BS.device)
    out = DecodeState(tokens_BS=state.tokens_BS[rows_B], valid_BS=state.valid_BS[rows_B],
                      next_pos_B=state.next_pos_B[rows_B], unsharded=state.unsharded,
                      capacity=state.capacity, padded=state.padded, plain=state.plain)
    filled = out.filled = state.filled
    for kb, vb in zip(state.key_bufs, state.value_bufs):
        for src, dst in ((kb, out.key_bufs), (vb, out.value_bufs)):
            buf = src.new_empty((len(rows_B), *src.shape[1:]))
            buf[:, :, :filled] = src[rows_B, :, :filled]
            dst.append(buf)
        out.keys.append(out.key_bufs[-1][:, :, :filled])
        out.values.append(out.value_bufs[-1][:, :, :filled])
    state.unsharded = []  # now owned by ``out``: finish_decode(out) reshards
    return out


def finish_decode(state: DecodeState) -> None:
    """Reshard what ``prefill`` unsharded and drop the cache (collective under FSDP)."""
    for m in state.unsharded:
        m.reshard()
    state.unsharded = []
    state.keys, state.values = [], []
    state.key_bufs, state.value_bufs = [], []
    state.plain = None  # drops the per-generation concatenated FFN weights
    if state.bucket is not None:  # its buffers stay, for the next generation of the same bucket
        state.bucket.in_use = False
        state.bucket = None
