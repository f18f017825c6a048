"""The step of the DPO family (DPO, Rafailov et al. 2023, eq. 7, its IPO/robust/hinge variants, and the
reference-free SimPO / ORPO / NLL-only baseline) with a pluggable reference strategy.

The step trains (``DPOStep``) and ``DPOStepMetrics`` measures it; the loss of ``algo.loss_type`` is
``losses.preference_loss``, the reference log-probs come from ``dpo_reference``, the held-out measurements from
``dpo_eval``. The step, its choices and departures: docs/algorithms.md, DPO.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import datasets
import torch

from refexp import titan
from refexp.algos.dpo_data import PairBatch, load_pairs
from refexp.algos.dpo_eval import DPOEval
from refexp.algos.dpo_reference import build_ref_source, pack, reference_sums
from refexp.algos.loop import Policy, build_policy, build_strategy, optimizer_step, reference_path, run_loop
from refexp.algos.microbatch import combine_metrics, row_chunks
from refexp.algos.shared_prompt import SharedPrompt, pair_logprobs, share_prompts
from refexp.components.context import RunContext
from refexp.components.data_order import batch_ids
from refexp.components.timing import now
from refexp.config import DPOConfig
from refexp.losses import preference_loss, sft_loss
from refexp.losses.kl import masked_sum, mean_token_kl
from refexp.reference import refcache
from refexp.reference.refcache import RefLogps
from refexp.reference.strategies import ReferenceStrategy
from refexp.runtime import distributed as rdist


class DPOStep:
    """The step function of the DPO family (stateless across steps: the pair order is keyed by step)."""

    def __init__(self, ctx: RunContext, policy: Policy, strategy: ReferenceStrategy, pairs: datasets.Dataset,
                 ref_source, build_stats: dict | None = None):
        self.ctx, self.policy, self.strategy, self.pairs = ctx, policy, strategy, pairs
        self.ref_source = ref_source
        self.a: DPOConfig = ctx.cfg.algo
        self._once = dict(build_stats or {})  # logged with the first step
        self.metrics = DPOStepMetrics(ctx, strategy, ref_source)

    def __call__(self, step: int, ckpt) -> dict:
        ctx, P = self.ctx, self.a.pairs_per_step
        ids = batch_ids(len(self.pairs), P, ctx.cfg.training.seed, step)[rdist.local_slice(ctx.parallel_dims, P)]
        batch, shared = pack(ctx, self.pairs, ids)
        started = now(ctx.device)
        ref, hits, misses = None, 0, 0
        if self.ref_source is not None:
            ref, hits, misses = self.ref_source.lookup(ids)
            ref = ref.to(ctx.device)
        ref_s = now(ctx.device) - started
        chunk_metrics, weights, chosen_logp, total = self._forward_backward(batch, shared, ref)
        grad_norm, lr = optimizer_step(ctx, self.policy, total, step, ckpt)
        out = self.metrics(batch, ref, combine_metrics(chunk_metrics, weights), chosen_logp, hits, misses)
        out.update({
            "optim/grad_norm": grad_norm,
            "optim/lr": lr,
            "perf/ref_fwd_s": ref_s,
            "perf/tokens_per_s": float(batch.tokens_BT.numel()) / max(now(ctx.device) - started, 1e-9),
            "mem/ref_params": float(titan.count_parameters(self.strategy.model)) if self.strategy.model is not None
            else 0.0,
        })
        out.update(self._once)
        self._once = {}
        return out

    def _forward_backward(self, batch: PairBatch, shared: SharedPrompt | None, ref: RefLogps | None):
        """The policy's forwards and backwards over the step's pairs, ``training.micro_batch_size`` pairs at a
        time (refexp/algos/microbatch.py), gradients accumulated in the policy. Returns the chunks' metrics and
        their weights (their shares of the pairs), the policy's log-probs of the chosen rows [B, T-1] (detached),
        and the whole batch's loss (detached)."""
        ctx, B, mask = self.ctx, batch.num_pairs, batch.mask_BT
        self.policy.model.train()
        n_rows = torch.tensor(float(B), device=ctx.device)
        g_rows = rdist.dp_sum(ctx.parallel_dims, n_rows)
        total = torch.zeros((), device=ctx.device)
        chunk_metrics, weights, chosen_logp = [], [], []
        chunks = row_chunks(B, ctx.cfg.training.micro_batch_size)
        whole = len(chunks) == 1
        nll_scale = None if whole else B / mask[:B].sum().clamp(min=1)
        for sl in chunks:
            sub, sub_shared = (batch, shared) if whole else self._sub_batch(batch, sl)
            sub_ref = ref if ref is None or whole else ref.select(range(sl.start, sl.stop))
            loss, m, logp = self._pair_loss(sub, sub_shared, sub_ref, nll_scale)
            w = (sl.stop - sl.start) / B  # every loss and metric of the family is a mean over pairs
            # this rank's share of the global pairs: FSDP sums gradients over ranks (docs/torchtitan-notes.md §5)
            (loss * w * n_rows / g_rows).backward()
            total += loss.detach() * w
            chunk_metrics.append(m)
            weights.append(w)
            chosen_logp.append(logp[:sub.num_pairs].detach())
        return chunk_metrics, weights, chosen_logp[0] if len(chosen_logp) == 1 else torch.cat(chosen_logp), total

    def _sub_batch(self, batch: PairBatch, sl: slice) -> tuple[PairBatch, SharedPrompt | None]:
        """Pairs ``sl`` of ``batch`` as their own ``[chosen; rejected]`` batch (same width), and its
        shared-prompt layout (``algo.share_prompt``)."""
        B = batch.num_pairs
        rows = torch.cat([torch.arange(sl.start, sl.stop), torch.arange(B + sl.start, B + sl.stop)])
        rows = rows.to(batch.tokens_BT.device)
        sub = PairBatch(batch.tokens_BT[rows], batch.mask_BT[rows], batch.lengths_B[rows])
        return sub, share_prompts(sub, self.ctx.task.tokenizer.pad_id) if self.a.share_prompt else None

    def _pair_loss(self, batch: PairBatch, shared: SharedPrompt | None, ref: RefLogps | None,
                   nll_scale: torch.Tensor | None):
        """The loss of ``algo.loss_type`` on one (micro-)batch: (loss, metrics, token log-probs [2b, T-1]).

        ``nll_scale``: when ``batch`` is one chunk of the step, the step's pairs over its chosen tokens.
        ORPO's NLL is a token mean over the step's chosen completions, so a chunk passes it per pair
        ([b]: each pair's summed NLL times ``nll_scale``), whose means the chunk weights sum exactly.
        """
        a, mask, B = self.a, batch.mask_BT, batch.num_pairs
        logp = pair_logprobs(partial(titan.token_logprobs, self.policy.model), batch, shared, select=True)  # [2b, T-1]
        seq_B = masked_sum(logp, mask, dim=-1)  # [2b] summed over completion tokens
        chosen_nll = None
        if a.uses_chosen_nll:
            chosen_nll = (sft_loss(logp[:B], mask[:B])[0] if nll_scale is None
                          else -seq_B[:B] * nll_scale)
        loss, m = preference_loss(a, seq_B[:B], seq_B[B:], batch.lengths_B[:B], batch.lengths_B[B:],
                                  *reference_sums(ref), chosen_nll)
        return loss, m, logp


class DPOStepMetrics:
    """The metrics a DPO step logs besides its optimizer and timings: the loss's metrics over the global batch,
    ``kl/ref_chosen_tokens`` and the reference cache's ``refcache/hits`` / ``misses``. Collective."""

    def __init__(self, ctx: RunContext, strategy: ReferenceStrategy, ref_source):
        self.ctx, self.strategy, self.ref_source = ctx, strategy, ref_source

    def __call__(self, batch: PairBatch, ref: RefLogps | None, loss_metrics: dict, chosen_logp_BT: torch.Tensor,
                 hits: int, misses: int) -> dict:
        """``loss_metrics``: this rank's, combined over its chunks; ``chosen_logp_BT``: the policy's log-probs
        of the chosen rows [B, T-1]; ``hits``, ``misses``: this rank's reference-cache lookups."""
        pd, B, mask = self.ctx.parallel_dims, batch.num_pairs, batch.mask_BT
        # every rank holds the same number of pairs: the plain mean over ranks is the global one
        out = rdist.dp_mean_metrics(pd, loss_metrics, device=self.ctx.device)
        if ref is not None:
            with torch.no_grad():  # exact over ranks: token-weighted sums, not a mean of rank means
                n_tok = mask[:B].sum().to(torch.float32)
                kl = mean_token_kl(chosen_logp_BT, ref.chosen_tok_BT(mask[:B]), mask[:B]) * n_tok
                out["kl/ref_chosen_tokens"] = float(rdist.dp_sum(pd, kl) / rdist.dp_sum(pd, n_tok).clamp(min=1))
        if isinstance(self.ref_source, (refcache.PrecomputedRefLogps, refcache.VersionedRefLogps)):
            counts = rdist.dp_sum(pd, torch.tensor([float(hits), float(misses)], device=self.ctx.device))
            out["refcache/hits"], out["refcache/misses"] = float(counts[0]), float(counts[1])
        return out


def train_dpo(ctx: RunContext, sft_dir: Path) -> dict:
    pairs = load_pairs(ctx, sft_dir)
    policy = build_policy(ctx, sft_dir)
    strategy, anchor = build_strategy(ctx, sft_dir, defer_build=True, policy=policy.model)
    ref_source, stats = build_ref_source(ctx, strategy, pairs, reference_path(ctx, sft_dir))
    if ctx.dist.is_rank0:
        src = type(ref_source).__name__ if ref_source is not None else "none (reference-free)"
        print(f"[refexp] DPO: {len(pairs)} pairs, loss {ctx.cfg.algo.loss_type}, reference {strategy.name}, "
              f"reference log-probs: {src}")
    step_fn = DPOStep(ctx, policy, strategy, pairs, ref_source, stats)
    measure = DPOEval(ctx, policy, strategy, anchor, pairs)
    return run_loop(ctx, policy, strategy, anchor, step_fn, extra_states={"dpo_eval": measure}, measure=measure,
                    desc="dpo")
