"""Batched sampling from the policy with a KV cache, and the behaviour log-probs of what was sampled.

Randomness is keyed to (seed, step, prompt, sample), never to the rank or the batch layout: each
row draws its uniforms from its own generator and samples by inverse CDF, so the same global
batch comes out whatever the world size or the per-rank slice.

Departures, on purpose:
- The behaviour log-prob is log softmax(logits / temperature) of the sampled token, *before*
  top-p truncation: that is what the trainer recomputes (TRL and verl do the same), so the
  importance ratio is exactly 1 on the first update of an on-policy batch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from refexp import titan
from refexp.runtime.distributed import any_rank, setup_timeout


def row_seed(*key: int) -> int:
    """A 63-bit seed from integers (seed, step, prompt id, sample id, ...), stable across processes."""
    h = hashlib.blake2b(",".join(map(str, key)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1)


def row_uniforms(keys: list[tuple[int, ...]], n: int) -> torch.Tensor:
    """[len(keys), n] uniforms in [0, 1), row i from its own generator seeded by keys[i]."""
    out = torch.empty(len(keys), n, dtype=torch.float64)
    for i, k in enumerate(keys):
        g = torch.Generator().manual_seed(row_seed(*k))
        out[i] = torch.rand(n, generator=g, dtype=torch.float64)
    return out


@dataclass
class Rollout:
    """Completions of a batch of prompts, in the training layout.

    tokens_BT:      [N, T] prompt (true length, no left pad) + completion + right padding
    mask_BT:        [N, T-1] bool, True where tokens[:, t+1] is a completion token (the stop id included)
    behaviour_logp: [N, T-1] float32 log-probs of those tokens under the sampling policy (0 elsewhere)
    completion_ids: list of N lists of sampled ids (the stop id, any of ``tokenizer.stop_ids``, included
                    when produced)
    texts:          N decoded completions (the stop id and padding removed)
    """

    tokens_BT: torch.Tensor
    mask_BT: torch.Tensor
    behaviour_logp: torch.Tensor
    completion_ids: list[list[int]]
    texts: list[str]

    @property
    def num_completion_tokens(self) -> int:
        return int(self.mask_BT.sum())


def _top_p_filter(probs_BV: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero the tail outside the smallest set of tokens whose mass reaches top_p (Holtzman et al. 2020)."""
    if top_p >= 1.0:
        return probs_BV
    sorted_p, idx = probs_BV.sort(dim=-1, descending=True)
    cum = sorted_p.cumsum(-1)
    drop = (cum - sorted_p) >= top_p  # keep the token that crosses top_p
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    return torch.zeros_like(probs_BV).scatter(-1, idx, sorted_p)


def _inverse_cdf(probs_BV: torch.Tensor, u_B: torch.Tensor) -> torch.Tensor:
    cdf = probs_BV.double().cumsum(-1)
    cdf = cdf / cdf[:, -1:]
    idx = torch.searchsorted(cdf, u_B.unsqueeze(-1).to(cdf.dtype).contiguous()).squeeze(-1)
    return idx.clamp_(max=probs_BV.shape[-1] - 1)


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    tokenizer,
    prompts: list[str],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    greedy: bool = False,
    keys: list[tuple[int, ...]] | None = None,
    max_prompt_len: int | None = None,
    stop_check_every: int = 1,
    static_decode: bool = False,
    static_capacity: int | None = None,
) -> Rollout:
    """Sample one completion per entry of ``prompts`` (repeat a prompt G times for a group).

    keys[i] seeds row i's randomness (e.g. (seed, step, prompt_id, sample_id)); required unless greedy.
    ``stop_check_every``: decode steps between the checks that every row has stopped (a device sync, and a
    collective with several ranks); finished rows emit masked padding meanwhile, so the result is the same.
    ``static_decode``: fixed-shape decode steps (``titan.prefill(static=True)``; finished rows stay in the batch).
    ``static_capacity``: their cache's slots (None: the longest prompt + ``max_new_tokens``); a fixed value
    (``rollout.decode_capacity``) keeps one compiled step per row bucket (``refexp/titan/static_decode.py``).
    """
    device = next(model.parameters()).device
    prompt_UL, lens_U, rows_B = _distinct_prompts(tokenizer, prompts, max_prompt_len, device)
    n = len(prompts)
    u_BT = None
    if not greedy:
        if keys is None or len(keys) != n:
            raise ValueError("generate(): keys (one per row) are required for sampling")
        u_BT = row_uniforms(keys, max_new_tokens).to(device)

    if static_decode:  # the rows are laid out in the kept buffers at prefill
        logits_UV, cache = titan.prefill(model, prompt_UL, lens_U, max_new_tokens=max_new_tokens, static=True,
                                         capacity=static_capacity, rows_B=rows_B)
    else:
        logits_UV, cache = titan.prefill(model, prompt_UL, lens_U, max_new_tokens=max_new_tokens)
        if prompt_UL.shape[0] < n:
            cache = titan.repeat_decode_rows(cache, rows_B)
    logits_AV = logits_UV[rows_B] if prompt_UL.shape[0] < n else logits_UV
    sampling = _Sampling(greedy, temperature, top_p, u_BT)
    out, logp_out, lengths = _decode(model, tokenizer, logits_AV, cache, sampling, n=n, max_new_tokens=max_new_tokens,
                                     stop_check_every=stop_check_every, static_decode=static_decode)
    return _to_training_layout(tokenizer, prompt_UL[rows_B], lens_U[rows_B], out, logp_out, lengths)


def _distinct_prompts(tokenizer, prompts: list[str], max_prompt_len: int | None, device
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The distinct prompts, left-padded [U, L], their lengths [U], and each row's distinct prompt [B].

    Each distinct prompt is prefilled once and its cache repeated for its rows (GRPO's G samples of a prompt
    share it): the prefill forward shrinks by the group size.
    """
    from refexp.tasks.batching import encode_prompts

    distinct = list(dict.fromkeys(prompts))
    try:
        prompt_UL, lens_U = encode_prompts(tokenizer, distinct, max_prompt_len or 1 << 30)
    except ValueError:
        encode_prompts(tokenizer, prompts, max_prompt_len or 1 << 30)  # the error names the row of ``prompts``
        raise
    index = {p: i for i, p in enumerate(distinct)}
    rows_B = torch.tensor([index[p] for p in prompts], dtype=torch.long, device=device)
    return prompt_UL.to(device), lens_U.to(device), rows_B


@dataclass
class _Sampling:
    """How a decode step picks its tokens: greedily, or by inverse CDF of the row's uniforms ``u_BT``
    [B, max_new_tokens] after temperature and top-p."""

    greedy: bool
    temperature: float
    top_p: float
    u_BT: torch.Tensor | None

    def next_tokens(self, logits_AV: torch.Tensor, rows, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens [A] of the rows ``rows`` still decoding at decode step ``t``, and their behaviour
        log-probs [A] (before top-p: what the trainer recomputes)."""
        logits_AV = logits_AV.float()
        if self.greedy:
            tok = logits_AV.argmax(-1)
            return tok, torch.log_softmax(logits_AV, -1).gather(-1, tok[:, None]).squeeze(-1)
        logp_AV = torch.log_softmax(logits_AV if self.temperature == 1.0 else logits_AV / self.temperature, -1)
        probs = _top_p_filter(logp_AV.exp(), self.top_p)
        tok = _inverse_cdf(probs, self.u_BT[rows, t])
        return tok, logp_AV.gather(-1, tok[:, None]).squeeze(-1)


def _decode(model, tokenizer, logits_AV: torch.Tensor, cache, sampling: _Sampling, *, n: int, max_new_tokens: int,
            stop_check_every: int, static_decode: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The decode loop from the prefill's last logits [n, V] and cache: sampled tokens [n, max_new_tokens]
    (padding after a row's stop id), their log-probs (0 there) and each row's completion length [n]."""
    device, pad = logits_AV.device, tokenizer.pad_id
    # Every eos id of the checkpoint's generation_config.json ends a row (TextTokenizer.stop_ids).
    stop_S = torch.tensor(tokenizer.stop_ids, dtype=torch.long, device=device)
    out = torch.full((n, max_new_tokens), pad, dtype=torch.long, device=device)
    logp_out = torch.zeros(n, max_new_tokens, dtype=torch.float32, device=device)
    lengths = torch.zeros(n, dtype=torch.long, device=device)
    # A: the rows still decoding (``active_A`` indexes the batch; None = all of them). Finished rows are
    # dropped from the decode batch at the stop checks, once enough of them have finished to pay for
    # copying the others' cache; until then they emit masked padding.
    active_A, done_A = None, torch.zeros(n, dtype=torch.bool, device=device)
    try:
        for t in range(max_new_tokens):
            rows = slice(None) if active_A is None else active_A
            tok, logp = sampling.next_tokens(logits_AV, rows, t)
            tok = torch.where(done_A, pad, tok)
            out[rows, t] = tok
            logp_out[rows, t] = torch.where(done_A, 0.0, logp)
            lengths[rows] += (~done_A).long()
            done_A |= torch.isin(tok, stop_S)
            if t == max_new_tokens - 1:
                break
            if (t + 1) % stop_check_every == 0:
                # Stop when every row has finished; a collective decision under FSDP/TP, where all
                # ranks hold the same rows' state only if they decode the same number of steps.
                if _all_done(done_A):
                    break
                keep_K = None if static_decode else _rows_worth_keeping(done_A)
                if keep_K is not None:
                    cache = titan.repeat_decode_rows(cache, keep_K)
                    active_A = keep_K if active_A is None else active_A[keep_K]
                    tok, done_A = tok[keep_K], done_A[keep_K]
            if t == 0 and static_decode and any_rank(titan.compiles_next_step(cache), device):
                # A bucket's first step compiles (minutes for a large model, not alike on every rank): the
                # rank done first must not wait for the others in the next collective under
                # comm.train_timeout_seconds (refexp/runtime/distributed.py, setup_timeout).
                with setup_timeout():
                    logits_AV, cache = titan.decode_step(model, tok, cache)
                continue
            logits_AV, cache = titan.decode_step(model, tok, cache)
    finally:
        titan.finish_decode(cache)
    return out, logp_out, lengths


DROP_FINISHED_SHARE = 0.125
"""Finished rows leave the decode batch once they are at least this share of it (and not all of it):
each later step then skips their GEMM rows and KV reads, for one copy of the remaining rows' cache."""


def _rows_worth_keeping(done_A: torch.Tensor) -> torch.Tensor | None:
    """Indices of the unfinished rows when dropping the finished ones pays (see DROP_FINISHED_SHARE),
    else None. Reads ``done_A`` on the host: called only at the stop checks, which sync anyway."""
    n_done = int(done_A.sum())
    if n_done == 0 or n_done == len(done_A) or n_done < DROP_FINISHED_SHARE * len(done_A):
        return None
    return (~done_A).nonzero().squeeze(1)


def _all_done(done_B: torch.Tensor) -> bool:
    """True when every row on every rank has finished (ranks decode different rows under FSDP)."""
    return not any_rank(bool((~done_B).any()), done_B.device)


def _to_training_layout(tokenizer, prompt_BL, lens_B, out_BN, logp_BN, lengths_B) -> Rollout:
    """Left-padded prompts + completions -> right-padded rows [prompt_i, completion_i, pad...]."""
    n, L = prompt_BL.shape
    lens, clens = lens_B.tolist(), lengths_B.tolist()
    T = max(p + c for p, c in zip(lens, clens))
    tokens = torch.full((n, T), tokenizer.pad_id, dtype=torch.long, device=prompt_BL.device)
    mask = torch.zeros(n, T - 1, dtype=torch.bool, device=prompt_BL.device)
    blogp = torch.zeros(n, T - 1, dtype=torch.float32, device=prompt_BL.device)
    ids, texts = [], []
    for i in range(n):
        p, c = lens[i], clens[i]
        tokens[i, :p] = prompt_BL[i, L - p:]
        tokens[i, p:p + c] = out_BN[i, :c]
        mask[i, p - 1:p - 1 + c] = True
        blogp[i, p - 1:p - 1 + c] = logp_BN[i, :c]
        row = out_BN[i, :c].tolist()
        ids.append(row)
        texts.append(tokenizer.decode(row))
    return Rollout(tokens, mask, blogp, ids, texts)
