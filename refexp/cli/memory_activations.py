"""What one training chunk keeps for backward, per token and per block: the activation counts, the shared-prompt
attention's own memory and the logits (of the positions the loss selects, one output-layer chunk at a time). The
memory plan (``refexp/cli/memory_plan.py``; what each count holds and why: docs/gpus.md, "What the plan counts") adds
them into its "policy training" and "reference forward" phases;
``tests/test_activation_count.py`` checks ``block_activation_elems`` against what autograd saves."""

from __future__ import annotations

from refexp.cli.memory_rows import TrainingChunk
from refexp.cli.memory_shapes import Shapes


def shared_attention_bytes(cfg, s: Shapes, shared_rows: int, shared_len: int, compute: int,
                           tp: int) -> tuple[float, str]:
    """Bytes and description of the shared-prompt attention's own memory for one training chunk
    (docs/gpus.md, "What the plan counts")."""
    a, task = cfg.algo, cfg.task
    if not getattr(a, "share_prompt", False):
        return 0, "prompts not shared"
    from refexp.algos.shared_prompt import attention_way

    per_prompt = a.group_size if a.name == "grpo" else 2  # GRPO's group, DPO's chosen and rejected
    N, T = shared_rows * per_prompt, task.max_prompt_len + (getattr(a, "max_new_tokens", None) or task.max_new_tokens)
    if attention_way(N, T, shared_rows, shared_len) == "mask":
        return shared_rows * shared_len ** 2, f"dense mask: {shared_rows} x {shared_len}^2 booleans"
    ac = cfg.activation_checkpoint
    if ac.mode == "full":
        layers = 1  # the block being recomputed
    elif ac.mode == "selective" and ac.selective_ac_option != "op":
        layers = s.n_layers - s.n_layers // int(ac.selective_ac_option) + 1
    else:
        layers = s.n_layers
    elems = N * T * (2 * s.q_width + 2 * s.kv_dim) - shared_rows * shared_len * (s.q_width + 2 * s.kv_dim)
    return elems * layers * compute / tp, (f"{N} usual rows x {T} tokens gathered for causal attention, "
                                           f"{layers} layer{'s' if layers > 1 else ''} kept")


def block_activation_elems(s: Shapes) -> int:
    """Elements one decoder block keeps for backward per token without checkpointing (docs/gpus.md, "What the
    plan counts")."""
    q, kv = s.q_width, s.kv_dim
    norms = 2 * (3 * s.dim + 1)  # attention_norm, ffn_norm: input, normalised input, matmul input, rstd
    sdpa = 2 * q + 2 * kv + s.n_heads  # queries, keys, values, output, log-sum-exp
    qk_norm = 2 * q + 2 * kv + s.n_heads + s.n_kv_heads if s.qk_norm else 0  # inputs, outputs, rstd per head
    return norms + sdpa + qk_norm + 4 * s.ffn


def activation_elems_per_token(s: Shapes, ac) -> tuple[int, int]:
    """(elements kept per token for all blocks, elements of one block's full set), as docs/gpus.md ("What the
    plan counts") counts them."""
    full_block = block_activation_elems(s)
    if ac.mode == "full":
        return s.n_layers * s.dim, full_block
    if ac.mode == "selective" and ac.selective_ac_option == "op":
        return s.n_layers * (2 * s.dim + 2 * s.q_width + 2 * s.kv_dim + 2 * s.ffn), full_block
    if ac.mode == "selective":  # every N-th block fully checkpointed
        n = int(ac.selective_ac_option)
        checkpointed = s.n_layers // n
        return checkpointed * s.dim + (s.n_layers - checkpointed) * full_block, full_block
    return s.n_layers * full_block, 0


def output_positions(chunk: TrainingChunk, tp: int) -> tuple[int, str]:
    """(positions the output layer runs at in one training or reference ``chunk``, what they are): the selected
    ones the loss reads (``titan.token_logprobs(select_BT=...)``), except under TP, where ``_selected_forward`` falls
    back to the vocab-sharded logits at every position (refexp/titan/logprobs.py)."""
    if tp > 1:
        return chunk.rows * chunk.length, "tokens (TP: every position)"
    return chunk.selected, chunk.what


def logit_bytes(positions: int, what: str, s: Shapes, compute: int, tp: int, *, backward: bool
                ) -> tuple[float, str]:
    """Bytes and description of the output layer's logits over ``positions`` positions (``output_positions``:
    ``what`` they are) as ``titan.token_logprobs`` holds them: each position's logits in the compute dtype and
    their float32 copy (the log-softmax's input), and with ``backward`` the gradients of both. Without TP the
    positions go ``FP32_CHUNK_ELEMENTS // vocab`` at a time through the output layer (``_selected_logprobs``):
    with more than one chunk, backward recomputes each chunk's logits (``torch.utils.checkpoint``) and a forward
    without a graph frees each chunk before the next, so one chunk's logits (and their gradients) are held at
    once, never every position's. Under TP the vocab-parallel log-softmax holds every position's [V/t] slice."""
    from refexp.titan.logprobs import FP32_CHUNK_ELEMENTS

    per_elem = (compute + 4) * (2 if backward else 1)
    if tp > 1:
        return positions * s.vocab / tp * per_elem, f"{positions} {what} x {s.vocab} vocab / {tp}"
    chunk = max(1, FP32_CHUNK_ELEMENTS // s.vocab)
    if positions <= chunk:
        return positions * s.vocab * per_elem, f"{positions} {what} x {s.vocab} vocab"
    return chunk * s.vocab * per_elem, (f"one chunk of {chunk} of {positions} {what} x {s.vocab} vocab "
                                        + ("(recomputed in backward)" if backward else "at a time"))
