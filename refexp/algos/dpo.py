"""DPO (Rafailov et al. 2023, eq. 7) and the reference-free SimPO / ORPO, with a pluggable reference strategy.

One step (docs/architecture.md): the global batch of ``algo.pairs_per_step`` preference pairs -> this rank's
slice -> reference log-probs (a forward, the precomputed table, the per-version memo, or none) ->
one policy forward over the pairs (one row per pair, chosen and rejected sharing the prompt:
``algo.share_prompt``, refexp/algos/shared_prompt.py; else the concatenated ``[chosen; rejected]``
rows), log-probs returned in the ``[chosen; rejected]`` layout -> the loss of
``algo.loss_type`` -> backward, clip, step -> the loop's reference update, eval, log, checkpoint.

Departures and choices:
- Pairs: ``dpo_data`` (on-policy pairs of the SFT model for the embedded task, or a file). Their
  order is a permutation keyed by (seed, epoch), as GRPO's prompts: the global batch is the same at
  any world size, and each data-parallel rank takes a contiguous slice of whole pairs.
- A moving reference is TR-DPO (Gorbatovski et al. 2024): ``periodic_reset`` is its hard update
  (every tau steps), ``ema`` its soft update (alpha, every ``sync_every`` steps).
- ``algo.precompute_ref``: a fixed reference's log-probs of the whole set are computed once and
  cached on disk (``refexp.refcache``), and the reference model is then freed (or never built when
  the file exists); a moving reference's are memoised per reference version.
- ``kl/ref`` is GRPO's quantity: KL(policy || current reference), the per-token k3 estimate
  (``refexp.kl.mean_token_kl``) averaged over completion tokens the policy *sampled*. DPO has no
  rollouts, so it is measured on the evaluation schedule (step 0, every ``eval.every`` steps, the
  end), on the held-out prompts and the very samples of ``kl/init`` (``refexp.evaluation.evaluate``),
  never in the training step. The loop measures before the reference update of that step, so
  ``kl_triggered`` decides on it at eval steps only. A fixed reference on the start checkpoint is the
  ``kl/init`` anchor, so its ``kl/ref`` is ``kl/init``; a fixed reference released after precomputing
  (``algo.precompute_ref``) on another checkpoint or dtype is built for the measurement and released
  again.
- ``kl/ref_chosen_tokens`` (every step) is the k3 estimate between policy and reference log-probs on the
  batch's *chosen* completions. Those tokens are data, not samples of the policy, so it is not a KL
  of the policy's own samples: a per-step diagnostic of how far the two models' log-probs have moved
  apart on the data, not comparable with GRPO's ``kl/ref``.
- Likelihood displacement (Pal et al. 2024, "Smaug"; Razin et al. 2024, "Unintentional Unalignment"):
  DPO can raise the margin while the chosen completions' likelihood falls. On the evaluation
  schedule ``logps/chosen_delta`` is the policy's mean summed log-prob of the chosen completions of
  the first ``eval.kl_prompts`` pairs minus its step-0 value (``DPOEval``; the step-0 value is
  checkpointed), and ``eval/logp_correct`` the mean summed log-prob of the task's reference
  completions of the ``kl/init`` held-out prompts. Falling values flag displacement.
- SimPO/ORPO ignore the reference in the loss; with a reference strategy other than ``none`` it is
  still run, for ``kl/ref`` and ``kl/ref_chosen_tokens`` only.
- ORPO's NLL term is the token mean over the chosen completions of the local batch (TRL's); ranks are
  weighted by pairs, exact when they hold equal token counts (the embedded task's fixed widths).
- FSDP sums gradients over ranks (docs/torchtitan-notes.md §5): each rank's mean loss is weighted by
  its share of the global pairs, so the update equals the single-process one.
- ``training.micro_batch_size``: the policy forward and backward run over chunks of pairs, each chunk's
  loss weighted by its share of the pairs (ORPO's token-mean NLL passed per pair so that it sums exactly):
  the accumulated gradient and the logged metrics are the whole step's.
"""

from __future__ import annotations

import gc
from contextlib import ExitStack
from dataclasses import asdict
from functools import partial
from pathlib import Path

import datasets
import torch

from refexp import distributed as rdist
from refexp import refcache, titan
from refexp.algos.dpo_data import PairBatch, load_pairs, pack_pairs, pairs_fingerprint
from refexp.algos.loop import Policy, build_policy, build_strategy, optimizer_step, reference_path, run_loop
from refexp.algos.microbatch import combine_metrics, row_chunks
from refexp.algos.shared_prompt import SharedPrompt, pair_logprobs, share_prompts
from refexp.config import DPOConfig
from refexp.context import RunContext
from refexp.data_order import batch_ids
from refexp.evaluation import InitAnchor, evaluate, reference_logprobs
from refexp.kl import masked_sum, mean_token_kl
from refexp.losses import add_nll_term, dpo_loss, nll_only_loss, orpo_loss, sft_loss, simpo_loss
from refexp.refcache import RefLogps
from refexp.reference import ReferenceStrategy
from refexp.timing import now


def preference_loss(a: DPOConfig, pol_c_B: torch.Tensor, pol_r_B: torch.Tensor, len_c_B: torch.Tensor,
                    len_r_B: torch.Tensor, ref: RefLogps | None, chosen_nll: torch.Tensor | None):
    """The loss of ``a.loss_type`` on summed policy log-probs [B] (and the reference's for DPO types), plus
    RPO's NLL term when ``a.nll_weight`` > 0; ``chosen_nll`` (the chosen completions' token-mean NLL) is
    needed when ``a.uses_chosen_nll``."""
    if a.loss_type == "sft":  # the NLL-only baseline (TRL's loss_type="sft")
        return nll_only_loss(pol_c_B, pol_r_B, chosen_nll)
    if a.loss_type == "orpo":  # Hong et al. 2024, eq. 6
        return orpo_loss(pol_c_B, pol_r_B, len_c_B, len_r_B, chosen_nll, lam=a.lam)
    if a.loss_type == "simpo":  # Meng et al. 2024, eq. 6
        loss, m = simpo_loss(pol_c_B, pol_r_B, len_c_B, len_r_B, beta=a.beta, gamma=a.gamma,
                             label_smoothing=a.label_smoothing)
    else:
        loss, m = dpo_loss(pol_c_B, pol_r_B, ref.chosen_N, ref.rejected_N, beta=a.beta, loss_type=a.loss_type,
                           label_smoothing=a.label_smoothing, chosen_lengths=len_c_B, rejected_lengths=len_r_B)
    return add_nll_term(loss, m, chosen_nll, a.nll_weight) if a.nll_weight > 0 else (loss, m)


# ---------------------------------------------------------------- reference log-probs
def pack(ctx: RunContext, pairs: datasets.Dataset, ids: list[int]) -> tuple[PairBatch, SharedPrompt | None]:
    """Pairs ``ids`` as ``[chosen; rejected]`` rows, and their shared-prompt layout (``algo.share_prompt``)."""
    batch = pack_pairs(ctx.task.tokenizer, pairs.select(ids)).to(ctx.device)
    return batch, share_prompts(batch, ctx.task.tokenizer.pad_id) if ctx.cfg.algo.share_prompt else None


def reference_rows(ctx: RunContext, strategy: ReferenceStrategy, pairs: datasets.Dataset, ids: list[int]) -> RefLogps:
    """The reference's log-probs of pairs ``ids``: one ``inference_mode`` forward."""
    batch, shared = pack(ctx, pairs, ids)
    return RefLogps.from_logprobs(pair_logprobs(strategy.logprobs, batch, shared), batch.mask_BT)


def build_ref_source(ctx: RunContext, strategy: ReferenceStrategy, pairs: datasets.Dataset, ref_path: Path):
    """Where a step's reference log-probs come from (None without a reference), and build stats.

    Builds the strategy's deferred model unless a fixed reference's log-probs are all on disk.
    """
    a = ctx.cfg.algo
    if not strategy.holds_model:
        return None, {}
    compute = partial(reference_rows, ctx, strategy, pairs)
    if not a.precompute_ref:
        strategy.ensure_model()
        return refcache.UncachedRefLogps(compute), {}
    if strategy.moves:
        strategy.ensure_model()
        return refcache.VersionedRefLogps(compute, lambda: strategy.version,
                                          partial(rdist.any_rank, device=ctx.device)), {}
    t0 = now(ctx.device)
    dtype = ctx.cfg.reference.dtype or ctx.cfg.training.dtype
    # share_prompt changes the float summation order of the reference forward (not its values beyond ~1e-7):
    # part of the key, so a run reads exactly what its own layout computes.
    model_key = {**asdict(ctx.cfg.model), "share_prompt": a.share_prompt}
    compute_dtype = ctx.cfg.training.compute_dtype(ctx.device.type)
    if compute_dtype != "float32":  # bf16 compute gives other values; float32 keys stay those of existing caches
        model_key["compute_dtype"] = compute_dtype
    key = refcache.cache_key(ref_path, dtype, pairs_fingerprint(pairs, ctx.task.tokenizer), model_key)

    def compute_all() -> RefLogps:
        strategy.ensure_model()
        r, d = rdist.dp_rank_and_degree(ctx.parallel_dims)
        with strategy.resident():  # reference.offload: one move to the device for the whole table
            return refcache.compute_table(compute, len(pairs), a.pairs_per_step, rank=r, degree=d,
                                          dp_sum=partial(rdist.dp_sum, ctx.parallel_dims), device=ctx.device)

    table, built = refcache.load_or_compute(refcache.cache_file(ctx.cache_dir, key), compute_all, num_rows=len(pairs))
    if strategy.model is not None:
        strategy.release_model()  # every value it could give is in the table
        gc.collect()
    return refcache.PrecomputedRefLogps(table), {"refcache/build_s": now(ctx.device) - t0,
                                                 "refcache/built": float(built)}


# ---------------------------------------------------------------- the step
class DPOStep:
    """The step function of the DPO family (stateless across steps: the pair order is keyed by step)."""

    def __init__(self, ctx: RunContext, policy: Policy, strategy: ReferenceStrategy, pairs: datasets.Dataset,
                 ref_source, build_stats: dict | None = None):
        self.ctx, self.policy, self.strategy, self.pairs = ctx, policy, strategy, pairs
        self.ref_source = ref_source
        self.a: DPOConfig = ctx.cfg.algo
        self._once = dict(build_stats or {})  # logged with the first step

    def __call__(self, step: int, ckpt) -> dict:
        ctx, a = self.ctx, self.a
        P = a.pairs_per_step
        pd = ctx.parallel_dims
        ids = batch_ids(len(self.pairs), P, ctx.cfg.training.seed, step)[rdist.local_slice(pd, P)]
        batch, shared = pack(ctx, self.pairs, ids)
        B, mask = batch.num_pairs, batch.mask_BT

        t0 = now(ctx.device)
        ref, hits, misses = None, 0, 0
        if self.ref_source is not None:
            ref, hits, misses = self.ref_source.lookup(ids)
            ref = ref.to(ctx.device)
        ref_s = now(ctx.device) - t0

        self.policy.model.train()
        n_rows = torch.tensor(float(B), device=ctx.device)
        g_rows = rdist.dp_sum(pd, n_rows)
        total = torch.zeros((), device=ctx.device)
        chunk_metrics, weights, chosen_logp = [], [], []
        chunks = row_chunks(B, ctx.cfg.training.micro_batch_size)
        whole = len(chunks) == 1
        nll_scale = None if whole else B / mask[:B].sum().clamp(min=1)
        for sl in chunks:  # training.micro_batch_size pairs at a time (refexp/algos/microbatch.py)
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
        grad_norm, lr = optimizer_step(ctx, self.policy, total, step, ckpt)

        # every rank holds the same number of pairs: the plain mean over ranks is the global one
        out = rdist.dp_mean_metrics(pd, combine_metrics(chunk_metrics, weights), device=ctx.device)
        if ref is not None:
            with torch.no_grad():  # exact over ranks: token-weighted sums, not a mean of rank means
                n_tok = mask[:B].sum().to(torch.float32)
                chosen = chosen_logp[0] if len(chosen_logp) == 1 else torch.cat(chosen_logp)
                kl = mean_token_kl(chosen, ref.chosen_tok_BT(mask[:B]), mask[:B]) * n_tok
                out["kl/ref_chosen_tokens"] = float(rdist.dp_sum(pd, kl) / rdist.dp_sum(pd, n_tok).clamp(min=1))
        if isinstance(self.ref_source, (refcache.PrecomputedRefLogps, refcache.VersionedRefLogps)):
            counts = rdist.dp_sum(pd, torch.tensor([float(hits), float(misses)], device=ctx.device))
            out["refcache/hits"], out["refcache/misses"] = float(counts[0]), float(counts[1])
        out.update({
            "optim/grad_norm": grad_norm,
            "optim/lr": lr,
            "perf/ref_fwd_s": ref_s,
            "perf/tokens_per_s": float(batch.tokens_BT.numel()) / max(now(ctx.device) - t0, 1e-9),
            "mem/ref_params": float(titan.count_parameters(self.strategy.model)) if self.strategy.model is not None
            else 0.0,
        })
        out.update(self._once)
        self._once = {}
        return out

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
        logp = pair_logprobs(partial(titan.token_logprobs, self.policy.model), batch, shared)  # [2b, T-1]
        seq_B = masked_sum(logp, mask, dim=-1)  # [2b] summed over completion tokens
        chosen_nll = None
        if a.uses_chosen_nll:
            chosen_nll = (sft_loss(logp[:B], mask[:B])[0] if nll_scale is None
                          else -seq_B[:B] * nll_scale)
        loss, m = preference_loss(a, seq_B[:B], seq_B[B:], batch.lengths_B[:B], batch.lengths_B[B:], ref, chosen_nll)
        return loss, m, logp


# ---------------------------------------------------------------- the held-out measurements
@torch.inference_mode()
def heldout_pair_metrics(ctx: RunContext, policy: Policy, strategy: ReferenceStrategy,
                         pairs: datasets.Dataset) -> dict[str, float]:
    """``eval/pref_accuracy`` and ``eval/pref_margin``: the step's ``rewards/accuracies`` and ``rewards/margins``
    (the loss's implicit rewards, TRL's definitions) over the first ``eval.num_prompts`` held-out pairs,
    from the policy and the current reference (none for the reference-free SimPO/ORPO). The pairs are
    split over the data-parallel ranks (``rdist.padded_share``: the same number of forwards on every
    rank, padding dropped after them), in batches of ``algo.pairs_per_step``, and the per-pair sums
    are added over ranks, so the numbers do not depend on the world size. Collective."""
    a: DPOConfig = ctx.cfg.algo
    n = min(ctx.cfg.eval.num_prompts, len(pairs))
    ids, real = rdist.padded_share(ctx.parallel_dims, n)
    acc = margin = 0.0
    with ExitStack() as stack:
        stack.enter_context(torch.no_grad())  # a measurement: no graph for the policy's forwards
        ref_fn = None if a.reference_free else stack.enter_context(reference_logprobs(strategy))
        for start in range(0, len(ids), a.pairs_per_step):
            batch, shared = pack(ctx, pairs, ids[start:start + a.pairs_per_step])
            B, mask = batch.num_pairs, batch.mask_BT
            logp = pair_logprobs(partial(titan.token_logprobs, policy.model), batch, shared)  # [2B, T-1]
            ref_logp = None if ref_fn is None else pair_logprobs(ref_fn, batch, shared)
            b = min(B, real - start)  # real pairs at the front of this batch; the rest is padding
            if b <= 0:
                continue
            seq_B = masked_sum(logp, mask, dim=-1)
            ref = None if ref_logp is None else RefLogps.from_logprobs(ref_logp, mask).select(range(b))
            chosen_nll = sft_loss(logp[:b], mask[:b])[0] if a.uses_chosen_nll else None
            _, m = preference_loss(a, seq_B[:b], seq_B[B:B + b], batch.lengths_B[:b], batch.lengths_B[B:B + b], ref,
                                   chosen_nll)
            acc += float(m["rewards/accuracies"]) * b  # both are means over pairs: weight by the batch's pairs
            margin += float(m["rewards/margins"]) * b
    sums = torch.tensor([acc, margin], dtype=torch.float64, device=ctx.device)  # on the collective's device
    acc, margin = rdist.dp_sum(ctx.parallel_dims, sums).tolist()
    return {"eval/pref_accuracy": acc / max(1, n), "eval/pref_margin": margin / max(1, n)}


class DPOEval:
    """The loop's ``measure`` for the DPO family: ``evaluation.evaluate`` (``eval/accuracy``, ``kl/init``,
    ``kl/ref`` against the current reference on the same samples, ``eval/logp_correct``) plus
    ``logps/chosen_delta``; on ``task=preference`` (no answers) ``heldout_pair_metrics`` instead of
    ``eval/accuracy`` and ``eval/logp_correct``, the ``kl/*`` samples drawn from the held-out pairs' prompts.
    Its step-0 chosen log-prob is state, checkpointed (torch Stateful), so a resumed run's delta is against
    the same start."""

    def __init__(self, ctx: RunContext, policy: Policy, strategy: ReferenceStrategy, anchor: InitAnchor,
                 pairs: datasets.Dataset):
        self.ctx, self.policy, self.strategy, self.anchor = ctx, policy, strategy, anchor
        self.ids = list(range(min(ctx.cfg.eval.kl_prompts, len(pairs))))
        self.pairs = pairs
        self.chosen_logp0: float | None = None

    def chosen_logp(self) -> float:
        """The policy's mean over the fixed pairs of the summed log-prob of the chosen completion (EOS
        included), packed as the step packs them (``pack``, ``pair_logprobs``). The pairs are split over
        the data-parallel ranks (``rdist.padded_share``, padding dropped) and the sums added. Collective."""
        share, real = rdist.padded_share(self.ctx.parallel_dims, len(self.ids))
        batch, shared = pack(self.ctx, self.pairs, [self.ids[i] for i in share])
        B = batch.num_pairs
        with torch.inference_mode():
            logp = pair_logprobs(partial(titan.token_logprobs, self.policy.model), batch, shared)  # [2B, T-1]
            total = masked_sum(logp[:B], batch.mask_BT[:B], dim=-1)[:real].sum().double()
        return float(rdist.dp_sum(self.ctx.parallel_dims, total.reshape(1))) / max(1, len(self.ids))

    def __call__(self) -> dict[str, float]:
        # The preference task has pairs, not answers: held-out pair metrics stand in for accuracy.
        pairs_only = self.ctx.task.name == "preference"
        out = evaluate(self.ctx, self.policy.model, self.anchor, reference=self.strategy,
                       with_logp_correct=not pairs_only, with_accuracy=not pairs_only)
        if pairs_only:
            out.update(heldout_pair_metrics(self.ctx, self.policy, self.strategy, self.ctx.task.eval))
        chosen = self.chosen_logp()
        if self.chosen_logp0 is None:  # the first measurement is step 0's (a resumed run loads it)
            self.chosen_logp0 = chosen
        out["logps/chosen_delta"] = chosen - self.chosen_logp0
        return out

    def state_dict(self) -> dict:
        return {"chosen_logp0": float("nan") if self.chosen_logp0 is None else self.chosen_logp0}

    def load_state_dict(self, sd: dict) -> None:
        v = float(sd["chosen_logp0"])
        self.chosen_logp0 = None if v != v else v  # NaN: saved before the step-0 measurement


def train_dpo(ctx: RunContext, sft_dir: Path) -> dict:
    pairs = load_pairs(ctx, sft_dir)
    policy = build_policy(ctx, sft_dir)
    strategy, anchor = build_strategy(ctx, sft_dir, defer_build=True)
    ref_source, stats = build_ref_source(ctx, strategy, pairs, reference_path(ctx, sft_dir))
    if ctx.dist.is_rank0:
        src = type(ref_source).__name__ if ref_source is not None else "none (reference-free)"
        print(f"[refexp] DPO: {len(pairs)} pairs, loss {ctx.cfg.algo.loss_type}, reference {strategy.name}, "
              f"reference log-probs: {src}")
    step_fn = DPOStep(ctx, policy, strategy, pairs, ref_source, stats)
    measure = DPOEval(ctx, policy, strategy, anchor, pairs)
    return run_loop(ctx, policy, strategy, anchor, step_fn, extra_states={"dpo_eval": measure}, measure=measure,
                    desc="dpo")
