"""One forward for several completions of the same prompt (DPO's chosen and rejected, GRPO's group): the
completions of a prompt packed into one row, with RoPE positions and an attention (a dense mask or
``titan.CausalRows``, whichever is cheaper) that give every log-prob of the usual layout. The layout, its bridges
and the cost rule: docs/algorithms.md, "One forward for several completions of a prompt".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from refexp import titan
from refexp.algos.dpo_data import PairBatch

GATHER_COST_PAIRS = 100
"""What gathering one usual-row position costs (its query/key/value in, its output back, and their
gradients), in query-key pairs of attention. ``attention="auto"`` takes ``titan.CausalRows`` when
N x T x (T + this) < U x S^2, i.e. when the pairs it saves pay for its gathers. Fitted on CPU with
``bench/bench_shared_attention.py`` (which prints the value each layout implies)."""


def attention_way(rows_N: int, length_T: int, shared_U: int, shared_S: int) -> str:
    """How ``attention="auto"`` attends for N usual rows of T tokens shared as U rows of S: "rows"
    (``titan.CausalRows``) when its N x T x (T + ``GATHER_COST_PAIRS``) pairs are fewer than the dense
    mask's U x S^2, else "mask". The memory plan (``refexp/cli/dry_run.py``) asks the same question."""
    rows_cost = rows_N * length_T * (length_T + GATHER_COST_PAIRS)
    return "rows" if rows_cost < shared_U * shared_S * shared_S else "mask"


@dataclass
class SharedPrompt:
    """Rows of the usual layout ([N, T] tokens, [N, T-1] completion mask) regrouped one row per prompt.

    tokens_US:    [U, S] long, U prompts
    positions_US: [U, S] long RoPE positions
    allowed_USS:  [U, S, S] bool, query x key: True where the query may attend to the key; None when
                  ``rows`` is set
    rows:         ``titan.CausalRows`` (the same attention from gathered usual rows), or None
    group_N:      [N] long: the shared row holding usual row n
    src_NT:       [N, T-1] long: for each completion column of usual row n, the column of the shared
                  log-probs [U, S-1] that holds it (0 where the mask is False)
    """

    tokens_US: torch.Tensor
    positions_US: torch.Tensor
    allowed_USS: torch.Tensor | None
    rows: "titan.CausalRows | None"
    group_N: torch.Tensor
    src_NT: torch.Tensor

    def forward_kwargs(self) -> dict:
        return {"positions_BT": self.positions_US,
                "allowed_BTT": self.allowed_USS if self.rows is None else self.rows}

    def selection(self, mask_NT: torch.Tensor) -> torch.Tensor:
        """bool [U, S-1]: the shared columns that hold a column of ``mask_NT`` (the usual layout's [N, T-1]),
        for ``titan.token_logprobs``' ``select_BT``; ``scatter`` reads only these."""
        U, S = self.tokens_US.shape
        out = torch.zeros(U, S - 1, dtype=torch.bool, device=mask_NT.device)
        out[self.group_N[:, None].expand_as(self.src_NT)[mask_NT], self.src_NT[mask_NT]] = True
        return out

    def scatter(self, shared_US: torch.Tensor, mask_NT: torch.Tensor) -> torch.Tensor:
        """Per-column values [U, S-1] (log-probs, entropies) back in the usual layout [N, T-1], 0 off the mask."""
        out = shared_US[self.group_N].gather(1, self.src_NT)
        return torch.where(mask_NT, out, torch.zeros((), dtype=out.dtype, device=out.device))


def _completion_spans(mask_NT: torch.Tensor) -> tuple[list[int], list[int]]:
    """First completion column and completion length of every row (one pass over the batch; each
    row's completion must be non-empty and contiguous)."""
    T1 = mask_NT.shape[1]
    m = mask_NT.to(torch.int8)
    count = m.sum(1)
    first = m.argmax(1)
    last = T1 - 1 - m.flip(1).argmax(1)
    bad = (count == 0) | (last - first + 1 != count)
    if bool(bad.any()):
        raise ValueError(f"rows {bad.nonzero().flatten().tolist()}: the completion is empty or not contiguous")
    return first.tolist(), count.tolist()


def share_prompt_rows(tokens_NT: torch.Tensor, mask_NT: torch.Tensor, groups: list[list[int]],
                      pad_id: int, attention: str = "auto") -> SharedPrompt:
    """The shared layout of the usual rows: ``groups[u]`` lists the rows whose prompt is shared row u's.

    ``mask_NT[n, t]`` is True where ``tokens_NT[n, t+1]`` is a completion token (``token_logprobs``'
    alignment); a row's prompt is everything before its completion. Runs once per training step:
    the per-row work is integer bookkeeping, the tensors are built in a few whole-batch operations.
    ``attention``: "mask" (dense [U, S, S]), "rows" (``titan.CausalRows``) or "auto" (the cheaper one,
    ``attention_way``).
    """
    if attention not in ("auto", "mask", "rows"):
        raise ValueError(f"attention={attention!r}: expected 'auto', 'mask' or 'rows'")
    tokens, mask = tokens_NT.cpu(), mask_NT.cpu()
    lay = _Layout.of(groups, *_completion_spans(mask), N=tokens.shape[0])
    lay.check_prompts(tokens)
    U, S = len(lay.rows_src), max(len(x[0]) for x in lay.rows_src)
    pad = lambda xs, v: xs + [v] * (S - len(xs))  # noqa: E731
    src_rows = torch.tensor([pad(x[0], 0) for x in lay.rows_src])
    src_cols = torch.tensor([pad(x[1], 0) for x in lay.rows_src])
    seg_US = torch.tensor([pad(x[3], -1) for x in lay.rows_src])  # -1: padding
    positions_US = torch.tensor([pad(x[2], 0) for x in lay.rows_src])
    tokens_US = torch.where(seg_US >= 0, tokens[src_rows, src_cols], torch.full((), pad_id, dtype=tokens.dtype))
    src = torch.zeros(mask.shape, dtype=torch.long)
    src[lay.src_n, lay.src_c] = torch.tensor(lay.src_v, dtype=torch.long)
    device = tokens_NT.device
    shared = dict(tokens_US=tokens_US.to(device), positions_US=positions_US.to(device),
                  group_N=torch.tensor(lay.group_N, device=device), src_NT=src.to(device))
    T = max(len(slots) for _, slots in lay.member_slots)
    p_U = [lay.p_N[g[0]] for g in groups]
    if attention == "rows" or (attention == "auto" and attention_way(len(lay.member_slots), T, U, S) == "rows"):
        return SharedPrompt(**shared, allowed_USS=None, rows=_causal_rows(lay.member_slots, p_U, S, T, device))
    return SharedPrompt(**shared, allowed_USS=_dense_mask(seg_US, p_U).to(device), rows=None)


@dataclass
class _Layout:
    """Where each slot of each shared row comes from, as integer lists (built row by row).

    rows_src:      per shared row u: (usual row, usual column, RoPE position, segment) of each of its slots;
                   segment k is the group's k-th completion (0 also for the prompt), with its bridge
    src_n, src_c:  the usual (row, column) of every completion log-prob column; src_v: its shared column
    member_slots:  per usual row m: (its shared row, the shared slot of each of its usual columns), for CausalRows
    group_N, lead_N, p_N: per usual row: its shared row, its group's first row, its prompt length
    """

    rows_src: list[tuple[list[int], list[int], list[int], list[int]]]
    src_n: list[int]
    src_c: list[int]
    src_v: list[int]
    member_slots: list[tuple[int, list[int]]]
    group_N: list[int]
    lead_N: list[int]
    p_N: list[int]

    @classmethod
    def of(cls, groups: list[list[int]], first: list[int], count: list[int], *, N: int) -> "_Layout":
        lay = cls([], [], [], [], [], [-1] * N, [0] * N, [0] * N)
        for u, members in enumerate(groups):
            n0 = members[0]
            p = first[n0] + 1  # column t predicts token t+1: the first completion token sits at position p
            r, c, pos, seg = [n0] * p, list(range(p)), list(range(p)), [0] * p
            for k, n in enumerate(members):
                if first[n] + 1 != p:
                    raise ValueError(f"rows {n0} and {n}: completions of one group do not share the prompt")
                if k > 0:  # the bridge: the prompt's last token again, at its position
                    r.append(n), c.append(p - 1), pos.append(p - 1), seg.append(k)
                start, length = len(r), count[n]  # where this completion's first token goes
                r += [n] * length
                c += range(p, p + length)
                pos += range(p, p + length)
                seg += [k] * length
                lay.src_n.extend([n] * length)
                lay.src_c.extend(range(first[n], first[n] + length))
                lay.src_v.extend(range(start - 1, start - 1 + length))  # predicted one column earlier
                # its usual row: the prompt's first p-1 tokens, its last one (the bridge from k=1 on), the completion
                lay.member_slots.append((u, [*range(p - 1), start - 1, *range(start, start + length)]))
                lay.group_N[n], lay.lead_N[n], lay.p_N[n] = u, n0, p
            lay.rows_src.append((r, c, pos, seg))
        if min(lay.group_N, default=0) < 0:
            raise ValueError(f"rows {[n for n in range(N) if lay.group_N[n] < 0]} are in no group")
        return lay

    def check_prompts(self, tokens_NT: torch.Tensor) -> None:
        """Every row's prompt tokens equal its group's first row's (ValueError naming the two rows)."""
        in_prompt = torch.arange(tokens_NT.shape[1])[None, :] < torch.tensor(self.p_N)[:, None]
        differs = ((tokens_NT != tokens_NT[self.lead_N]) & in_prompt).any(1)
        if bool(differs.any()):
            n = int(differs.nonzero()[0])
            raise ValueError(f"rows {self.lead_N[n]} and {n}: completions of one group do not share the prompt")


def _dense_mask(seg_US: torch.Tensor, p_U: list[int]) -> torch.Tensor:
    """The [U, S, S] query x key booleans of the layout: the prompt and first completion attend causally; a
    later completion to the prompt's first p-1 tokens, its bridge and itself, causally."""
    S = seg_US.shape[1]
    q_idx, k_idx = torch.arange(S)[None, :, None], torch.arange(S)[None, None, :]
    seg_q, seg_k = seg_US[:, :, None], seg_US[:, None, :]
    p = torch.tensor(p_U)[:, None, None]
    real = (k_idx <= q_idx) & ((seg_q == 0) | (seg_k == seg_q) | (k_idx <= p - 2)) & (seg_q >= 0)
    pad_self = (seg_q < 0) & (k_idx == q_idx)  # padding sees itself only (never used; an all-masked row is NaN)
    return real | pad_self


def _causal_rows(member_slots: list[tuple[int, list[int]]], p_U: list[int], S: int, T: int,
                 device) -> "titan.CausalRows":
    """``titan.CausalRows`` of the layout: usual row m gathers ``member_slots[m]`` of its shared row (padded
    with its last slot); a shared slot takes the output of the usual position it stands for (the prompt's
    first p-1 slots: the group's first member's; padding slots: position 0 of that member)."""
    N, U = len(member_slots), len(p_U)
    gather = torch.empty(N, T, dtype=torch.long)
    owner = torch.full((U, S), -1, dtype=torch.long)
    first_member = {}
    for m, (u, slots) in enumerate(member_slots):
        gather[m] = torch.tensor([u * S + s for s in slots + [slots[-1]] * (T - len(slots))])
        first = first_member.setdefault(u, m)
        p = p_U[u]
        cols = range(len(slots)) if first == m else range(p - 1, len(slots))  # the prompt's own slots once
        owner[u, torch.tensor([slots[t] for t in cols])] = torch.tensor([m * T + t for t in cols])
    for u, m in first_member.items():
        owner[u][owner[u] < 0] = m * T  # padding
    return titan.CausalRows(gather.to(device), owner.to(device))


def share_prompts(batch: PairBatch, pad_id: int, attention: str = "auto") -> SharedPrompt:
    """DPO: one shared row per pair of ``batch`` (rows ``[chosen; rejected]``)."""
    B = batch.num_pairs
    return share_prompt_rows(batch.tokens_BT, batch.mask_BT, [[i, B + i] for i in range(B)], pad_id, attention)


def share_groups(tokens_NT: torch.Tensor, mask_NT: torch.Tensor, group_size: int, pad_id: int,
                 attention: str = "auto") -> SharedPrompt:
    """GRPO: one shared row per prompt of consecutive groups of ``group_size`` rows."""
    N = tokens_NT.shape[0]
    return share_prompt_rows(tokens_NT, mask_NT, [list(range(u, u + group_size)) for u in range(0, N, group_size)],
                             pad_id, attention)


def row_logprobs(logprobs_fn, tokens_NT: torch.Tensor, mask_NT: torch.Tensor, shared: SharedPrompt | None,
                 *, select: bool = False, **kwargs):
    """``logprobs_fn(tokens_NT, **kwargs)`` (``titan.token_logprobs`` bound to a model, or a reference
    strategy's ``logprobs``), computed on the shared rows when ``shared`` is given and returned in the
    usual layout [N, T-1] (0 off ``mask_NT``). Tuples (log-probs, entropy) and None pass through.
    ``select``: also pass ``select_BT`` (``mask_NT``, or its shared columns), so the output layer runs only
    at the masked positions (``titan.token_logprobs``); ``logprobs_fn`` must then take ``select_BT``, and
    the result is 0 off ``mask_NT`` either way."""
    if shared is None:
        return logprobs_fn(tokens_NT, **kwargs, **({"select_BT": mask_NT} if select else {}))
    if select:
        kwargs["select_BT"] = shared.selection(mask_NT)
    out = logprobs_fn(shared.tokens_US, **kwargs, **shared.forward_kwargs())
    if out is None:
        return None
    if isinstance(out, tuple):
        return tuple(None if x is None else shared.scatter(x, mask_NT) for x in out)
    return shared.scatter(out, mask_NT)


def pair_logprobs(logprobs_fn, batch: PairBatch, shared: SharedPrompt | None, *, select: bool = False
                  ) -> torch.Tensor | None:
    """Token log-probs [2B, T-1] of a DPO batch in its ``[chosen; rejected]`` layout (``select``: as
    ``row_logprobs``')."""
    return row_logprobs(logprobs_fn, batch.tokens_BT, batch.mask_BT, shared, select=select)
