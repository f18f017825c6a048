"""Forward passes of a built model: full logits, and next-token log-probs (and entropy) [B, T-1].

Under TP the logits come back as a vocab-sharded DTensor; ``token_logprobs`` then works on each
rank's vocabulary slice and all-reduces max, sum-exp and the target logit, never gathering [B, T, V].
Otherwise the float32 log-softmax runs over chunks of rows (``FP32_CHUNK_ELEMENTS`` each), so beyond
the model's own logits (bf16 under mixed precision) no float32 [B, T, V] tensor exists at once: in a
differentiable call each chunk is recomputed in backward instead of keeping its float32 copy.
The entropy is a metric: always computed without gradient.

With ``select_BT`` (the positions a loss or a metric reads, e.g. completion tokens) the output layer runs
only there: the trunk (embeddings, layers, final norm) once, then the output projection on the selected
positions' hidden states in chunks of ``FP32_CHUNK_ELEMENTS``, so no [B, T, V] logits exist; in a
differentiable call each chunk's logits are recomputed in backward (``torch.utils.checkpoint``). TRL 1.16's
GRPO/DPO trainers skip the prompt positions only with Triton: ``add_fused_lm_head`` (trl/trainer/utils.py) projects
the completion positions alone when ``trl.kernels.chunked_logprob._use_triton(device)`` holds (Triton installed and
a CUDA or XPU device); on a CPU their fused output layer projects every position, in tiles.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.utils.checkpoint import checkpoint
from torchtitan.models.common import ScaledDotProductAttention

from refexp.titan.attention import MaskedSDPA
from refexp.titan.lora import has_adapters
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


SELECT_POSITIONS = True
"""Whether ``token_logprobs(select_BT=...)`` runs the output layer at the selected positions only. False: at
every position, the result zeroed off the selection (the same values; ``bench/bench_step.py --full-logits``
measures what the selection saves)."""

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
                   allowed_BTT: torch.Tensor | None = None, select_BT: torch.Tensor | None = None):
    """Next-token log-probabilities of a batch, float32 [B, T-1].

    ``logp_BT[:, t] = log p(tokens[:, t+1] | tokens[:, :t+1])`` under softmax(logits / temperature).
    Rows are plain causal sequences (pad on the right, mask afterwards) unless ``positions_BT`` and
    ``allowed_BTT`` (bool [B, T, T], query x key) say otherwise: then column t is the distribution at
    position t given the keys it may attend to. Differentiable. Under TP the vocab-sharded logits are
    never gathered; otherwise the float32 log-softmax runs in chunks of rows. With ``with_entropy``
    also returns the entropy [B, T-1] of the same tempered next-token distribution (no gradient: a
    metric). Returns log-probs, never logits.

    ``select_BT`` (bool [B, T-1]): compute only where True (0 elsewhere, in log-probs and entropy); the
    output layer then runs on the selected positions only (``_selected_logprobs``). Values at the selected
    positions are those of the full computation.
    """
    if _outside_inference_mode(model):
        with torch.inference_mode(False), torch.no_grad():
            return token_logprobs(model, tokens_BT, temperature=temperature, with_entropy=with_entropy,
                                  positions_BT=positions_BT, allowed_BTT=allowed_BTT, select_BT=select_BT)
    targets_BT = tokens_BT[:, 1:]
    if select_BT is not None:
        if select_BT.dtype != torch.bool or tuple(select_BT.shape) != tuple(targets_BT.shape):
            raise ValueError(f"select_BT: expected a bool tensor of shape {tuple(targets_BT.shape)} ([B, T-1]), "
                             f"got {select_BT.dtype} {tuple(select_BT.shape)}")
    if select_BT is not None and SELECT_POSITIONS:
        out = _selected_forward(model, tokens_BT, positions_BT, allowed_BTT, select_BT, temperature, with_entropy)
        if isinstance(out, tuple):
            return out if with_entropy else out[0]
    else:
        out = _forward(model, tokens_BT, positions_BT, allowed_BTT)
    out_BTV = out[:, :-1]
    if isinstance(out_BTV, DTensor):
        logp_BT, entropy_BT = _vocab_parallel_logprobs(out_BTV, targets_BT, temperature, with_entropy)
    else:
        logp_BT, entropy_BT = _chunked_logprobs(out_BTV, targets_BT, temperature, with_entropy)
    if select_BT is not None:  # TP (``_selected_forward``) or not SELECT_POSITIONS: same values, 0 off the selection
        zero = torch.zeros((), dtype=logp_BT.dtype, device=logp_BT.device)
        logp_BT = torch.where(select_BT, logp_BT, zero)
        entropy_BT = None if entropy_BT is None else torch.where(select_BT, entropy_BT, zero)
    return (logp_BT, entropy_BT) if with_entropy else logp_BT


def _chunk_logprobs(h_KD: torch.Tensor, weight_VD: torch.Tensor, bias_V: torch.Tensor | None,
                    targets_K: torch.Tensor, temperature: float, entropy_out: list | None) -> torch.Tensor:
    """log p(target) [K] of K positions' final hidden states [K, D] through the output layer, float32.

    ``entropy_out``: a one-slot list the entropy [K] (no gradient) is put in on the first call only, so
    checkpoint's recomputation in backward does not compute it again."""
    out_KV = F.linear(h_KD, weight_VD, bias_V)
    logp_K = _target_logprobs(out_KV, targets_K, temperature)
    if entropy_out is not None and not entropy_out:
        entropy_out.append(_entropy(out_KV.detach(), temperature))
    return logp_K


def _selected_logprobs(h_BTD: torch.Tensor, weight_VD: torch.Tensor, bias_V: torch.Tensor | None,
                       targets_BT: torch.Tensor, select_BT: torch.Tensor, temperature: float,
                       with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropy) [K] at the K True positions of ``select_BT`` (row-major order) from the final
    hidden states h [B, T, D] (T = select's T-1 columns) and the output layer's weight [V, D].

    Positions go ``FP32_CHUNK_ELEMENTS // V`` at a time through the output layer and the float32
    log-softmax; when there is more than one chunk and a gradient is wanted each chunk is checkpointed,
    so backward recomputes its [chunk, V] logits instead of keeping them."""
    h_KD, targets_K = h_BTD[select_BT], targets_BT[select_BT]
    K, V = h_KD.shape[0], weight_VD.shape[0]
    rows = max(1, FP32_CHUNK_ELEMENTS // V)
    recompute = K > rows and torch.is_grad_enabled() and (h_KD.requires_grad or weight_VD.requires_grad)
    logps, ents = [], []
    for i in range(0, max(K, 1), rows):
        box = [] if with_entropy else None
        args = (h_KD[i:i + rows], weight_VD, bias_V, targets_K[i:i + rows], temperature, box)
        logps.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False) if recompute
                     else _chunk_logprobs(*args))
        if with_entropy:
            ents.append(box[0])
    return torch.cat(logps), torch.cat(ents) if with_entropy else None


@contextmanager
def _output_layer_replaced(lm_head: nn.Module, forward):
    """``lm_head``'s forward replaced by ``forward`` within the block. An instance attribute shadows the
    class's ``forward`` while ``nn.Module.__call__`` still runs the module's hooks around it, so FSDP
    unshards the weight for it and registers its backward on the result as it does for the logits."""
    lm_head.forward = forward
    try:
        yield
    finally:
        del lm_head.forward


def _selected_forward(model: nn.Module, tokens_BT: torch.Tensor, positions_BT, allowed_BTT,
                      select_BT: torch.Tensor, temperature: float, with_entropy: bool):
    """``token_logprobs`` with the output layer applied at ``select_BT``'s positions only: (log-probs,
    entropy or None) [B, T-1], 0 off the selection; or, where it falls back, the full logits [B, T, V].

    The model's own forward runs (its hooks, FSDP's unsharding, attention masks) with the output layer
    replaced by ``_selected_logprobs`` on its input, the final hidden states. Under tensor parallelism the
    output layer is vocabulary-sharded (DTensor weight and hooks that turn its output into a Shard(-1)
    DTensor): there the replacement calls the layer itself and ``token_logprobs`` goes on with the
    vocab-parallel path over all positions (correct, not cheaper), from the logits returned; so does an output layer
    with a LoRA adapter, whose forward (and view) is its own.
    """
    lm_head = decoder_of(model).lm_head
    layer_forward = type(lm_head).forward
    adapted = has_adapters(lm_head)
    targets_BT = tokens_BT[:, 1:]
    entropy: list = []

    def forward(h_BTD):
        weight, bias = lm_head.weight, lm_head.bias
        # tensor parallel, or an output layer with a LoRA adapter (model.lora): the layer itself, the full logits
        if isinstance(h_BTD, DTensor) or isinstance(weight, DTensor) or adapted:
            return layer_forward(lm_head, h_BTD)
        logp_K, ent_K = _selected_logprobs(h_BTD[:, :-1], weight, bias, targets_BT, select_BT, temperature,
                                           with_entropy)
        entropy.append(ent_K)
        return logp_K

    with _output_layer_replaced(lm_head, forward):
        out = _forward(model, tokens_BT, positions_BT, allowed_BTT)
    if isinstance(out, DTensor) or out.dim() != 1:
        return out  # full logits (TP): ``token_logprobs`` goes on as without a selection
    zeros = torch.zeros(select_BT.shape, dtype=out.dtype, device=out.device)
    logp_BT = zeros.masked_scatter(select_BT, out)
    entropy_BT = zeros.masked_scatter(select_BT, entropy[0]) if with_entropy else None
    return logp_BT, entropy_BT
