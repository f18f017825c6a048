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
    decoding takes the sub-modules' path (TP). ``static``: fixed-shape steps (``plain_static_step``) over
    ``bucket``'s kept buffers (``static_decode.StaticBucket``: rows padded to the bucket's, a fixed capacity;
    ``key_bufs``/``value_bufs`` are its buffers), of which the first B rows are this generation's.
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
    bucket: object | None = None  # static_decode.StaticBucket


def append_kv(state: DecodeState, layer: int, k_BNLH: torch.Tensor, v_BNLH: torch.Tensor) -> int:
    """Write the new keys/values into the layer's buffers (in place; doubling when full), point
    ``state.keys[layer]``/``values[layer]`` at the filled slots, and return how many were filled before."""
    B, N, L, H = k_BNLH.shape
    if layer == len(state.key_bufs):  # prefill: the layer's first tokens
        start, cap = 0, max(state.capacity, L)
        state.key_bufs.append(k_BNLH.new_empty(B, N, cap, H))
        state.value_bufs.append(v_BNLH.new_empty(B, N, cap, H))
        state.keys.append(k_BNLH)
        state.values.append(v_BNLH)
    else:
        start = state.keys[layer].shape[2]
    kb, vb = state.key_bufs[layer], state.value_bufs[layer]
    if start + L > kb.shape[2]:
        cap = max(2 * kb.shape[2], start + L)
        kb = torch.cat([kb[:, :, :start], kb.new_empty(B, N, cap - start, H)], dim=2)
        vb = torch.cat([vb[:, :, :start], vb.new_empty(B, N, cap - start, H)], dim=2)
        state.key_bufs[layer], state.value_bufs[layer] = kb, vb
    kb[:, :, start:start + L].copy_(k_BNLH)
    vb[:, :, start:start + L].copy_(v_BNLH)
    state.keys[layer], state.values[layer] = kb[:, :, :start + L], vb[:, :, :start + L]
    state.filled = start + L
    return start

