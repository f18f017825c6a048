"""One forward for several completions of the same prompt: DPO's chosen and rejected, GRPO's group.

The usual layout runs the prompt once per completion: DPO's concatenated pass (``dpo_data.pack_pairs``)
has a chosen row and a rejected row, GRPO has G rows per prompt. Prefix sharing (Wang et al. 2024,
"Accelerating Direct Preference Optimization with Prefix Sharing", arXiv:2410.20305) packs the
completions of a prompt into one row and lets an attention mask keep each completion from seeing
the others:

    row u:  prompt (p tokens) | completion 0 (c0) | bridge | completion 1 (c1) | bridge | ... | pad
    RoPE:   0 .. p-1          | p .. p+c0-1       | p-1    | p .. p+c1-1       | p-1    | ... | 0

A *bridge* is a copy of the prompt's last token at the prompt's last position, attending to the
prompt's first p-1 tokens and to itself: exactly what the prompt's last token sees in its own row,
so its hidden state equals that token's at every layer, and its next-token distribution is the one
the completion's first token is scored by. A completion's tokens attend to the first p-1 prompt
tokens, their bridge (standing for the prompt's last token) and the completion's earlier tokens.
Every log-prob is therefore the one of the usual layout (up to float summation order), and a
prompt's K rows of p + c tokens become one of p + sum(c) + K - 1: for DPO at 32 + 32 + 32 tokens,
25% fewer tokens; for GRPO's 4 completions of 32 tokens after a 32-token prompt, 36% fewer.

The cost: the mask is dense ([rows, S, S] booleans; SDPA computes every query x key product), so
attention grows with the square of the shared row. That is small next to the projections and MLP
while S is well below ~6 x the model dim; with many long completions per prompt (GRPO with G=16 and
1k-token rollouts) set ``algo.share_prompt=false``. Only the SDPA backend takes the mask
(``titan.MaskedSDPA``; checked in ``config.check_cross_fields``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from refexp.algos.dpo_data import PairBatch


@dataclass
class SharedPrompt:
    """Rows of the usual layout ([N, T] tokens, [N, T-1] completion mask) regrouped one row per prompt.

    tokens_US:    [U, S] long, U prompts
    positions_US: [U, S] long RoPE positions
    allowed_USS:  [U, S, S] bool, query x key: True where the query may attend to the key
    group_N:      [N] long: the shared row holding usual row n
    src_NT:       [N, T-1] long: for each completion column of usual row n, the column of the shared
                  log-probs [U, S-1] that holds it (0 where the mask is False)
    """

    tokens_US: torch.Tensor
    positions_US: torch.Tensor
    allowed_USS: torch.Tensor
    group_N: torch.Tensor
    src_NT: torch.Tensor

    def forward_kwargs(self) -> dict:
        return {"positions_BT": self.positions_US, "allowed_BTT": self.allowed_USS}

    def scatter(self, shared_US: torch.Tensor, mask_NT: torch.Tensor) -> torch.Tensor:
        """Per-column values [U, S-1] (log-probs, entropies) back in the usual layout [N, T-1], 0 off the mask."""
        out = shared_US[self.group_N].gather(1, self.src_NT)
        return torch.where(mask_NT, out, torch.zeros((), dtype=out.dtype, device=out.device))


def _span(mask_T: torch.Tensor, n: int) -> tuple[int, int]:
    """(first column, count) of row n's completion columns, which must be contiguous."""
    cols = mask_T.nonzero().flatten()
    k = cols.numel()
    if k == 0 or int(cols[-1] - cols[0]) + 1 != k:
        raise ValueError(f"row {n}: the completion is empty or not contiguous")
    return int(cols[0]), k


def share_prompt_rows(tokens_NT: torch.Tensor, mask_NT: torch.Tensor, groups: list[list[int]],
                      pad_id: int) -> SharedPrompt:
    """The shared layout of the usual rows: ``groups[u]`` lists the rows whose prompt is shared row u's.

    ``mask_NT[n, t]`` is True where ``tokens_NT[n, t+1]`` is a completion token (``token_logprobs``'
    alignment); a row's prompt is everything before its completion.
    """
    tokens, mask = tokens_NT.cpu(), mask_NT.cpu()
    N = tokens.shape[0]
    rows, segs, prompt_lens = [], [], []
    group_N = torch.full((N,), -1, dtype=torch.long)
    src = torch.zeros(mask.shape, dtype=torch.long)
    for u, members in enumerate(groups):
        parts, seg, pos, p = [], [], [], None
        for k, n in enumerate(members):
            c0, c = _span(mask[n], n)
            if p is None:
                p = c0 + 1  # column t predicts token t+1: the first completion token sits at position p
                parts.append(tokens[n, :p])
                seg += [0] * p
                pos.append(torch.arange(p))
            elif c0 + 1 != p or not torch.equal(tokens[n, :p], tokens[members[0], :p]):
                raise ValueError(f"rows {members[0]} and {n}: completions of one group do not share the prompt")
            if k > 0:  # the bridge: the prompt's last token again, at its position
                parts.append(tokens[n, p - 1:p])
                seg.append(k)
                pos.append(torch.tensor([p - 1]))
            start = sum(len(x) for x in parts)  # where this completion's first token goes
            parts.append(tokens[n, p:p + c])
            seg += [k] * c
            pos.append(torch.arange(p, p + c))
            src[n, c0:c0 + c] = torch.arange(start - 1, start - 1 + c)  # predicted one column earlier
            group_N[n] = u
        rows.append((torch.cat(parts), torch.tensor(seg), torch.cat(pos)))
        prompt_lens.append(p)
    if bool((group_N < 0).any()):
        raise ValueError(f"rows {(group_N < 0).nonzero().flatten().tolist()} are in no group")
    U, S = len(rows), max(len(r[0]) for r in rows)
    tokens_US = torch.full((U, S), pad_id, dtype=tokens.dtype)
    positions_US = torch.zeros(U, S, dtype=torch.long)
    seg_US = torch.full((U, S), -1, dtype=torch.long)  # -1: padding
    for u, (t, s, p) in enumerate(rows):
        tokens_US[u, :len(t)], seg_US[u, :len(t)], positions_US[u, :len(t)] = t, s, p
    q_idx, k_idx = torch.arange(S)[None, :, None], torch.arange(S)[None, None, :]
    seg_q, seg_k = seg_US[:, :, None], seg_US[:, None, :]
    p_U = torch.tensor(prompt_lens)[:, None, None]
    # prompt and first completion: causal; a later completion: prompt[:p-1], its bridge and itself, causal
    real = (k_idx <= q_idx) & ((seg_q == 0) | (seg_k == seg_q) | (k_idx <= p_U - 2)) & (seg_q >= 0)
    pad = (seg_q < 0) & (k_idx == q_idx)  # padding sees itself only (never used; an all-masked row is NaN)
    device = tokens_NT.device
    return SharedPrompt(tokens_US.to(device), positions_US.to(device), (real | pad).to(device),
                        group_N.to(device), src.to(device))


def share_prompts(batch: PairBatch, pad_id: int) -> SharedPrompt:
    """DPO: one shared row per pair of ``batch`` (rows ``[chosen; rejected]``)."""
    B = batch.num_pairs
    return share_prompt_rows(batch.tokens_BT, batch.mask_BT, [[i, B + i] for i in range(B)], pad_id)


def share_groups(tokens_NT: torch.Tensor, mask_NT: torch.Tensor, group_size: int, pad_id: int) -> SharedPrompt:
    """GRPO: one shared row per prompt of consecutive groups of ``group_size`` rows."""
    N = tokens_NT.shape[0]
    return share_prompt_rows(tokens_NT, mask_NT, [list(range(u, u + group_size)) for u in range(0, N, group_size)],
                             pad_id)


def row_logprobs(logprobs_fn, tokens_NT: torch.Tensor, mask_NT: torch.Tensor, shared: SharedPrompt | None,
                 **kwargs):
    """``logprobs_fn(tokens_NT, **kwargs)`` (``titan.token_logprobs`` bound to a model, or a reference
    strategy's ``logprobs``), computed on the shared rows when ``shared`` is given and returned in the
    usual layout [N, T-1] (0 off ``mask_NT``). Tuples (log-probs, entropy) and None pass through."""
    if shared is None:
        return logprobs_fn(tokens_NT, **kwargs)
    out = logprobs_fn(shared.tokens_US, **kwargs, **shared.forward_kwargs())
    if out is None:
        return None
    if isinstance(out, tuple):
        return tuple(None if x is None else shared.scatter(x, mask_NT) for x in out)
    return shared.scatter(out, mask_NT)


def pair_logprobs(logprobs_fn, batch: PairBatch, shared: SharedPrompt | None) -> torch.Tensor | None:
    """Token log-probs [2B, T-1] of a DPO batch in its ``[chosen; rejected]`` layout."""
    return row_logprobs(logprobs_fn, batch.tokens_BT, batch.mask_BT, shared)
