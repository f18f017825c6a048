"""Forward passes of a built model: full logits, and next-token log-probs (and entropy) [B, T-1].

Under TP the logits come back as a vocab-sharded DTensor; ``token_logprobs`` then works on each
rank's vocabulary slice and all-reduces max, sum-exp and the target logit, never gathering [B, T, V].
Otherwise the float32 log-softmax runs over chunks of rows (``FP32_CHUNK_ELEMENTS`` each), so beyond
the model's own logits (bf16 under mixed precision) no float32 [B, T, V] tensor exists at once: in a
differentiable call each chunk is recomputed in backward instead of keeping its float32 copy.
The entropy is a metric: always computed without gradient.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.checkpoint import checkpoint
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torchtitan.models.common import ScaledDotProductAttention

from refexp.titan.attention import MaskedSDPA
from refexp.titan.unwrap import decoder_of, full_tensor


def _inner_attention(model: nn.Module) -> nn.Module:
    return next(iter(decoder_of(model).layers.values())).attention.inner_attention


def _forward(model: nn.Module, tokens_BT: torch.Tensor, positions_BT: torch.Tensor | None = None,
             allowed_BTT: torch.Tensor | None = None):
    """``model(tokens)``: causal logits [B, T, V] (a vocab-sharded DTensor under TP).

    SDPA needs no mask (causal, docs/torchtitan-notes.md §3); flex/varlen need one, built from
    positions 0..T-1 per row. ``positions_BT``/``allowed_BTT`` (RoPE positions and a bool [B, T, T]
    attention mask) replace 0..T-1 and causal attention; only the SDPA backend (``MaskedSDPA``) takes them.
    """
    if allowed_BTT is not None or positions_BT is not None:
        if not isinstance(_inner_attention(model), MaskedSDPA):
            raise ValueError("explicit positions/attention masks need model.attn_backend=sdpa")
        return model(tokens_BT, positions=positions_BT, attention_masks=allowed_BTT)
    if isinstance(_inner_attention(model), ScaledDotProductAttention):
        return model(tokens_BT)
    B, T = tokens_BT.shape
    positions_BT = torch.arange(T, device=tokens_BT.device).expand(B, T)
    masks = decoder_of(model).get_attention_masks(positions_BT)
    return model(tokens_BT, attention_masks=masks)


def _outside_inference_mode(model: nn.Module) -> bool:
    """Whether a forward of ``model`` must leave ``torch.inference_mode`` (and run under no_grad).

    torch 2.13's FSDP2 on a 1-rank shard group (TP-only: torchtitan always applies FSDP) copies into
    its unsharded buffer under ``_unsafe_preserve_version_counter``, which fails for inference
    tensors, and DTensor views of the vocab-sharded logits fail in inference mode too ("Cannot set
    version_counter for inference tensor"). Results are the same; only the fast path is lost.
    """
    from torch.distributed.fsdp import FSDPModule

    return torch.is_inference_mode_enabled() and any(isinstance(m, FSDPModule) for m in model.modules())


def logits(model: nn.Module, tokens_BT: torch.Tensor) -> torch.Tensor:
    """Full logits float32 [B, T, V] (all-gathered over the vocab under TP). Only for small
    vocabularies / debugging: prefer ``token_logprobs``."""
    if _outside_inference_mode(model):
        with torch.inference_mode(False), torch.no_grad():
            return logits(model, tokens_BT)
    return full_tensor(_forward(model, tokens_BT)).float()  # a vocab-sharded DTensor under TP


def vocab_shard_mesh_dim(x: DTensor) -> int:
    dims = [i for i, p in enumerate(x.placements) if isinstance(p, Shard) and p.dim in (-1, x.ndim - 1)]
    others = [p for i, p in enumerate(x.placements) if i not in dims and not isinstance(p, Replicate)]
    if len(dims) != 1 or others:
        raise ValueError(f"expected logits sharded over the vocabulary on one mesh dim, got {x.placements}")
    return dims[0]


def _sum_over_mesh_dim(local: torch.Tensor, like: DTensor, mesh_dim: int) -> torch.Tensor:
    """All-reduce SUM of ``local`` over one mesh dim, autograd-aware: the backward is the identity,
    which is right for a loss every TP rank computes identically (DTensor Partial -> Replicate)."""
    placements = [Replicate()] * like.device_mesh.ndim
    placements[mesh_dim] = Partial()
    return DTensor.from_local(local, like.device_mesh, placements, run_check=False).full_tensor()


def _vocab_parallel_logprobs(logits_BTV: DTensor, targets_BT: torch.Tensor, temperature: float,
                             with_entropy: bool):
    """log p(target) (and entropy) from vocab-sharded logits without gathering the vocabulary:
    each rank works on its [B, T, V/tp] slice; max, sum-exp and the target logit are all-reduced."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    mesh_dim = vocab_shard_mesh_dim(logits_BTV)
    local_shape, offset = compute_local_shape_and_global_offset(
        logits_BTV.shape, logits_BTV.device_mesh, logits_BTV.placements
    )
    v0, v_local = offset[-1], local_shape[-1]
    z_BTv = logits_BTV.to_local().float() / temperature
    m_BT1 = z_BTv.detach().amax(-1, keepdim=True)
    dist.all_reduce(m_BT1, op=dist.ReduceOp.MAX, group=logits_BTV.device_mesh.get_group(mesh_dim))
    z_BTv = z_BTv - m_BT1  # a constant shift: log-softmax is unchanged, exp cannot overflow
    lse_BT = _sum_over_mesh_dim(z_BTv.exp().sum(-1), logits_BTV, mesh_dim).log()
    mine_BT = (targets_BT >= v0) & (targets_BT < v0 + v_local)
    idx_BT1 = (targets_BT - v0).clamp(0, v_local - 1).unsqueeze(-1)
    target_BT = _sum_over_mesh_dim(z_BTv.gather(-1, idx_BT1).squeeze(-1) * mine_BT, logits_BTV, mesh_dim)
    logp_BT = target_BT - lse_BT
    if not with_entropy:
        return logp_BT, None
    with torch.no_grad():  # a metric
        logq_BTv = z_BTv - lse_BT.unsqueeze(-1)
        entropy_BT = -_sum_over_mesh_dim((logq_BTv.exp() * logq_BTv).sum(-1), logits_BTV, mesh_dim)
    return logp_BT, entropy_BT


FP32_CHUNK_ELEMENTS = 2**25
"""Elements of one float32 chunk of the log-softmax (128 MiB): rows [B, T, V] are processed
ceil(B*T*V / this) rows at a time. A batch that fits in one chunk runs as a single piece."""


def _target_logprobs(out_BTV: torch.Tensor, targets_BT: torch.Tensor, temperature: float) -> torch.Tensor:
    """log p(target) [B, T] from one chunk of logits (any float dtype), in float32."""
    z_BTV = out_BTV.float()
    if temperature != 1.0:
        z_BTV = z_BTV / temperature
    # gather - logsumexp keeps one [B, T, V] tensor alive instead of log_softmax's second one.
    return z_BTV.gather(-1, targets_BT.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z_BTV, dim=-1)


@torch.no_grad()
def _entropy(out_BTV: torch.Tensor, temperature: float) -> torch.Tensor:
    """Entropy [B, T] of softmax(logits / temperature) of one chunk, float32, without gradient."""
    z_BTV = out_BTV.float()
    if temperature != 1.0:
        z_BTV = z_BTV / temperature
    logq_BTV = z_BTV - torch.logsumexp(z_BTV, dim=-1, keepdim=True)
    return -(logq_BTV.exp() * logq_BTV).sum(-1)


def _chunked_logprobs(out_BTV: torch.Tensor, targets_BT: torch.Tensor, temperature: float, with_entropy: bool):
    """Log-probs (and entropy) [B, T] over chunks of rows of plain logits (see the module docstring)."""
    B, T, V = out_BTV.shape
    rows = max(1, FP32_CHUNK_ELEMENTS // max(1, T * V))
    if rows >= B:  # one piece: nothing to recompute
        logp_BT = _target_logprobs(out_BTV, targets_BT, temperature)
        return logp_BT, _entropy(out_BTV, temperature) if with_entropy else None
    grad = torch.is_grad_enabled() and out_BTV.requires_grad
    logps, ents = [], []
    for i in range(math.ceil(B / rows)):
        sl = slice(i * rows, (i + 1) * rows)
        if grad:  # backward recomputes the chunk's float32 log-softmax from the logits
            logps.append(checkpoint(_target_logprobs, out_BTV[sl], targets_BT[sl], temperature, use_reentrant=False))
        else:
            logps.append(_target_logprobs(out_BTV[sl], targets_BT[sl], temperature))
        if with_entropy:
            ents.append(_entropy(out_BTV[sl], temperature))
    return torch.cat(logps), torch.cat(ents) if with_entropy else None


def token_logprobs(model: nn.Module, tokens_BT: torch.LongTensor, *, temperature: float = 1.0,
                   with_entropy: bool = False, positions_BT: torch.Tensor | None = None,
                   allowed_BTT: torch.Tensor | None = None):
    """Next-token log-probabilities of a batch, float32 [B, T-1].

    ``logp_BT[:, t] = log p(tokens[:, t+1] | tokens[:, :t+1])`` under softmax(logits / temperature).
    Rows are plain causal sequences (pad on the right, mask afterwards) unless ``positions_BT`` and
    ``allowed_BTT`` (bool [B, T, T], query x key) say otherwise: then column t is the distribution at
    position t given the keys it may attend to. Differentiable. Under TP the vocab-sharded logits are
    never gathered; otherwise the float32 log-softmax runs in chunks of rows. With ``with_entropy``
    also returns the entropy [B, T-1] of the same tempered next-token distribution (no gradient: a
    metric). Returns log-probs, never logits.
    """
    if _outside_inference_mode(model):
        with torch.inference_mode(False), torch.no_grad():
            return token_logprobs(model, tokens_BT, temperature=temperature, with_entropy=with_entropy,
                                  positions_BT=positions_BT, allowed_BTT=allowed_BTT)
    out_BTV = _forward(model, tokens_BT, positions_BT, allowed_BTT)[:, :-1]
    targets_BT = tokens_BT[:, 1:]
    if isinstance(out_BTV, DTensor):
        logp_BT, entropy_BT = _vocab_parallel_logprobs(out_BTV, targets_BT, temperature, with_entropy)
    else:
        logp_BT, entropy_BT = _chunked_logprobs(out_BTV, targets_BT, temperature, with_entropy)
    return (logp_BT, entropy_BT) if with_entropy else logp_BT
