"""The exact KL between two models' next-token distributions at chosen positions, summed over the whole vocabulary.

``token_kl(model, other, tokens, select_BT=...)`` gives, at each selected position t,
KL(p_t ‖ q_t) = sum_v p_t(v) (log p_t(v) - log q_t(v)), with p_t = softmax(model's logits / temperature) and q_t the
same of ``other``, both given the prefix ``tokens[:, :t+1]``. The k3 of the token sampled at t+1 (``losses/kl.py``)
is a one-sample estimate of it; this is its expectation, with no token-sampling noise.

Both models' full log-softmax is needed at every position, so nothing of size [B, T, V] is made: each model's
forward runs with its output layer replaced (``logprobs._output_layer_replaced``, as ``select_BT`` does for
log-probs) by one that keeps the final hidden states at the selected positions and the output layer's weight,
gathered to a plain tensor (under FSDP the unsharded weight inside the forward, copied; under TP the vocab-sharded
weight all-gathered, so each rank holds [V, D] of each model). The positions then go ``FP32_CHUNK_ELEMENTS // V``
at a time through both output layers and their float32 log-softmax, so the working memory is a few [chunk, V]
float32 tensors whatever the batch (``logprobs.py``'s bound). Under TP the output layer is still called once inside
the forward for its hooks (vocab-sharded logits at every position, discarded: correct, not cheaper, as
``token_logprobs`` under TP).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from refexp.titan.logprobs import FP32_CHUNK_ELEMENTS, _forward, _output_layer_replaced, _outside_inference_mode
from refexp.titan.lora import LoRAView, viewed
from refexp.titan.unwrap import decoder_of, full_tensor


@dataclass
class OutputStates:
    """What a model's next-token distributions at K positions are made of: softmax((h_KD W_VD^T + b_V) / T)."""

    h_KD: torch.Tensor
    """The output layer's input (the final norm's output) at the K selected positions, row-major order."""
    weight_VD: torch.Tensor
    """The output layer's whole weight, a plain tensor."""
    bias_V: torch.Tensor | None


def output_states(model: nn.Module, tokens_BT: torch.Tensor, select_BT: torch.Tensor,
                  positions_BT: torch.Tensor | None = None, allowed_BTT: torch.Tensor | None = None
                  ) -> OutputStates:
    """The final hidden states at ``select_BT``'s positions (bool [B, T-1]: column t predicts token t+1) and the
    output layer, without gradient. Collective under FSDP/TP (one forward, and under TP the weight's all-gather):
    every rank calls it the same number of times."""
    if _outside_inference_mode(model):
        with torch.inference_mode(False), torch.no_grad():
            return output_states(model, tokens_BT, select_BT, positions_BT, allowed_BTT)
    if select_BT.dtype != torch.bool or tuple(select_BT.shape) != (tokens_BT.shape[0], tokens_BT.shape[1] - 1):
        raise ValueError(f"select_BT: expected a bool tensor of shape {(tokens_BT.shape[0], tokens_BT.shape[1] - 1)} "
                         f"([B, T-1]), got {select_BT.dtype} {tuple(select_BT.shape)}")
    lm_head = decoder_of(model).lm_head
    layer_forward = type(lm_head).forward
    kept: list[OutputStates] = []

    def forward(h_BTD):
        weight, bias = lm_head.weight, lm_head.bias
        # a copy: FSDP frees its unsharded weight after the forward; under TP full_tensor gathers the vocab
        weight_VD = full_tensor(weight).detach().clone()
        bias_V = None if bias is None else full_tensor(bias).detach().clone()
        kept.append(OutputStates(full_tensor(h_BTD)[:, :-1][select_BT].detach(), weight_VD, bias_V))
        if isinstance(h_BTD, DTensor) or isinstance(weight, DTensor):  # TP: the layer's own output for its hooks
            return layer_forward(lm_head, h_BTD)
        return h_BTD.new_zeros(0)

    with torch.no_grad(), _output_layer_replaced(lm_head, forward):
        _forward(model, tokens_BT, positions_BT, allowed_BTT)
    return kept[0]


def _log_softmax(s: OutputStates, rows: slice, temperature: float) -> torch.Tensor:
    """[k, V] float32 log-softmax of one chunk of positions' logits / temperature (the logits in the states'
    dtype, as ``token_logprobs`` makes them)."""
    z_kV = F.linear(s.h_KD[rows], s.weight_VD, s.bias_V).float()
    if temperature != 1.0:
        z_kV = z_kV / temperature
    return torch.log_softmax(z_kV, dim=-1)


def _chunk_kl(p: OutputStates, q: OutputStates, rows: slice, temperature: float) -> torch.Tensor:
    """[k] KL(p ‖ q) at one chunk of positions. Its own function, so that the chunk's [k, V] tensors are freed on
    return, before the next chunk's are made: at most three float32 [k, V] at once."""
    logp_kV = _log_softmax(p, rows, temperature)
    diff_kV = logp_kV - _log_softmax(q, rows, temperature)
    return (logp_kV.exp_() * diff_kV).sum(-1)


@torch.no_grad()
def position_kl(p: OutputStates, q: OutputStates, temperature: float = 1.0) -> torch.Tensor:
    """[K] float32 KL(p ‖ q) at each of the K positions of two models' ``OutputStates`` (the same positions),
    over chunks of ``FP32_CHUNK_ELEMENTS // V`` positions."""
    K, V = p.h_KD.shape[0], p.weight_VD.shape[0]
    if q.h_KD.shape[0] != K or q.weight_VD.shape[0] != V:
        raise ValueError(f"position_kl: the two models' states differ in positions or vocabulary: "
                         f"{K} x {V} against {q.h_KD.shape[0]} x {q.weight_VD.shape[0]}")
    step = max(1, FP32_CHUNK_ELEMENTS // max(1, V))
    out = [_chunk_kl(p, q, slice(i, i + step), temperature) for i in range(0, K, step)]
    return torch.cat(out) if out else p.h_KD.new_zeros(0, dtype=torch.float32)


def token_kl(model: nn.Module, other: nn.Module | LoRAView, tokens_BT: torch.Tensor, *, select_BT: torch.Tensor,
             temperature: float = 1.0, positions_BT: torch.Tensor | None = None,
             allowed_BTT: torch.Tensor | None = None) -> torch.Tensor:
    """Float32 [B, T-1]: at each position ``select_BT`` selects, KL(model ‖ other) of the next-token distributions
    (both tempered by ``temperature``) given the prefix, summed over the vocabulary; 0 elsewhere. No gradient.
    Collective under FSDP/TP (a forward of each model)."""
    p = output_states(model, tokens_BT, select_BT, positions_BT, allowed_BTT)
    with viewed(other) as other_model:  # a LoRA policy's anchor is the policy itself with its adapters off
        q = output_states(other_model, tokens_BT, select_BT, positions_BT, allowed_BTT)
    kl_K = position_kl(p, q, temperature)
    return torch.zeros(select_BT.shape, dtype=torch.float32, device=kl_K.device).masked_scatter(select_BT, kl_K)
