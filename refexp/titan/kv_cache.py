"""The decode loop's state: the KV cache buffers and how a step's keys/values are written into them
(shared by the sub-modules' path in ``decode.py`` and the plain step in ``decode_step_plain.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn


@dataclass
class DecodeState:
    """Everything ``decode_step`` needs between steps.

    Slots are the columns of the left-padded batch: ``valid_BS`` marks real tokens (kept up to date only
    when ``padded``), ``tokens_BS`` holds the prompt's. ``keys``/``values`` hold per-layer
    [B, n_kv_heads, S, head_dim] after RoPE (this rank's KV heads under TP): views of the first S slots
    of preallocated buffers (``key_bufs``/``value_bufs``, ``capacity`` slots, grown by doubling), so a
    decode step writes one slot in place instead of copying the whole cache (a ``torch.cat`` per layer
    per step would copy it every step).
    ``filled``: how many slots hold keys/values (every layer alike after a whole step). A fixed-shape
    decode (``static``) reads the whole buffers and does not refresh ``keys``/``values`` after prefill.
    ``next_pos_B`` is the RoPE position of each row's next token. ``padded``: some prompt was
    left-padded, so attention needs the explicit ``valid_BS`` mask (otherwise it is plain causal).
    ``plain``: the weights of the one-token step on plain tensors (``decode_step_plain.py``), None where
    decoding takes the sub-modules' path (TP). ``static``: fixed-shape steps (``plain_static_step``): the
    buffers never grow, ``slot_1`` ([1] long, on the device) is the next slot and ``allowed_BC`` ([B, C]
    bool) the slots each row's queries may see.
    """

    tokens_BS: torch.Tensor
    valid_BS: torch.Tensor
    next_pos_B: torch.Tensor
    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    unsharded: list[nn.Module] = field(default_factory=list)
    capacity: int = 0
    filled: int = 0
    key_bufs: list[torch.Tensor] = field(default_factory=list)
    value_bufs: list[torch.Tensor] = field(default_factory=list)
    padded: bool = True
    plain: object | None = None  # decode_step_plain.PlainStepWeights
    static: bool = False
    slot_1: torch.Tensor | None = None
    allowed_BC: torch.Tensor | None = None


def append_kv(state: DecodeState, layer: int, k_BNLH: torch.Tensor, v_BNLH: torch.Tensor) -> int:
    """Write the new keys/values into the layer's buffers (in place; doubling when full), point
    ``state.keys[layer]``/``values[layer]`` at the filled slots, and return how many were filled before."""
    B, N, L, H = k_BNLH.shape
    if layer == len(state.key_bufs):  # prefill: the layer's first tokens
        start, cap = 0, max(state.capacity, L)
        state.key_bufs.append(new_cache_buffer(k_BNLH, (B, N, cap, H), state))
        state.value_bufs.append(new_cache_buffer(v_BNLH, (B, N, cap, H), state))
        state.keys.append(k_BNLH)
        state.values.append(v_BNLH)
    else:
        start = state.keys[layer].shape[2]
    kb, vb = state.key_bufs[layer], state.value_bufs[layer]
    if start + L > kb.shape[2]:
        assert not state.static, "a fixed-shape decode never grows its cache (prefill reserves max_new_tokens)"
        cap = max(2 * kb.shape[2], start + L)
        kb = torch.cat([kb[:, :, :start], kb.new_empty(B, N, cap - start, H)], dim=2)
        vb = torch.cat([vb[:, :, :start], vb.new_empty(B, N, cap - start, H)], dim=2)
        state.key_bufs[layer], state.value_bufs[layer] = kb, vb
    kb[:, :, start:start + L].copy_(k_BNLH)
    vb[:, :, start:start + L].copy_(v_BNLH)
    state.keys[layer], state.values[layer] = kb[:, :, :start + L], vb[:, :, :start + L]
    state.filled = start + L
    return start


def new_cache_buffer(like: torch.Tensor, shape: tuple[int, ...], state: DecodeState) -> torch.Tensor:
    """An uninitialised cache buffer, zeroed for a fixed-shape decode: its step reads unfilled slots
    (masked, but 0 x NaN would still be NaN); the other paths read only the filled ones."""
    if not state.static:
        return like.new_empty(shape)
    return static_address(like.new_zeros(shape), state)


def static_address(t: torch.Tensor, state: DecodeState) -> torch.Tensor:
    """Mark a fixed-shape decode's buffer as living at a fixed address (CUDA graphs then read and write it
    in place rather than copying it in at every replay)."""
    if state.static and t.is_cuda:
        torch._dynamo.mark_static_address(t)
    return t
