"""Where a DPO step's reference log-probs come from: a live forward, the precomputed table of a fixed reference,
the per-version memo of a moving one, or none (docs/algorithms.md, DPO); and pairs packed for a forward.
"""

from __future__ import annotations

import gc
from functools import partial
from pathlib import Path

import datasets

from refexp.algos.dpo_data import PairBatch, pack_pairs, pairs_fingerprint
from refexp.algos.shared_prompt import SharedPrompt, pair_logprobs, share_prompts
from refexp.algos.start_key import start_in_key
from refexp.components.context import RunContext
from refexp.components.timing import now
from refexp.config.diff import in_cache_terms
from refexp.config.model import model_identity
from refexp.reference import refcache
from refexp.reference.refcache import RefLogps
from refexp.reference.strategies import ReferenceStrategy, reference_source
from refexp.runtime import distributed as rdist


def pack(ctx: RunContext, pairs: datasets.Dataset, ids: list[int]) -> tuple[PairBatch, SharedPrompt | None]:
    """Pairs ``ids`` as ``[chosen; rejected]`` rows, and their shared-prompt layout (``algo.share_prompt``)."""
    batch = pack_pairs(ctx.task.tokenizer, pairs.select(ids)).to(ctx.device)
    return batch, share_prompts(batch, ctx.task.tokenizer.pad_id) if ctx.cfg.algo.share_prompt else None


def reference_rows(ctx: RunContext, strategy: ReferenceStrategy, pairs: datasets.Dataset, ids: list[int]) -> RefLogps:
    """The reference's log-probs of pairs ``ids``: one ``inference_mode`` forward."""
    batch, shared = pack(ctx, pairs, ids)
    return RefLogps.from_logprobs(pair_logprobs(strategy.logprobs, batch, shared, select=True), batch.mask_BT)


def reference_sums(ref: RefLogps | None) -> tuple:
    """The reference's summed log-probs of the chosen and rejected completions ([B] each), or two Nones
    (``losses.preference_loss``'s ``ref_c_B``, ``ref_r_B``)."""
    return (None, None) if ref is None else (ref.chosen_N, ref.rejected_N)


def build_ref_source(ctx: RunContext, strategy: ReferenceStrategy, pairs: datasets.Dataset, ref_path: Path):
    """Where a step's reference log-probs come from (None without a reference), and build stats:
    ``refcache.UncachedRefLogps`` (a forward per step), ``VersionedRefLogps`` (``algo.precompute_ref`` with a
    moving reference) or ``PrecomputedRefLogps`` (with a fixed one).

    Builds the strategy's deferred model unless a fixed reference's log-probs are all on disk.
    """
    source = reference_source(ctx.cfg)
    if source == "none":
        return None, {}
    compute = partial(reference_rows, ctx, strategy, pairs)
    if source == "live":
        strategy.ensure_model()
        return refcache.UncachedRefLogps(compute), {}
    if source == "versioned":
        strategy.ensure_model()
        return refcache.VersionedRefLogps(compute, lambda: strategy.version,
                                          partial(rdist.any_rank, device=ctx.device)), {}
    return _precomputed(ctx, strategy, pairs, ref_path, compute)


def _table_key(ctx: RunContext, pairs: datasets.Dataset, ref_path: Path) -> str:
    """The precomputed table's cache key: the reference checkpoint and dtype, the pairs, the model and layout; paths
    into the cache by their place in it (``in_cache_terms``, ``start_in_key``), so a copied or moved cache keeps it."""
    a = ctx.cfg.algo
    dtype = ctx.cfg.reference.dtype or ctx.cfg.training.dtype
    # share_prompt changes the float summation order of the reference forward (not its values beyond ~1e-7):
    # part of the key, so a run reads exactly what its own layout computes.
    model_key = {**in_cache_terms(model_identity(ctx.cfg.model), ctx.cfg.sft.cache_dir), "share_prompt": a.share_prompt}
    compute_dtype = ctx.cfg.training.compute_dtype(ctx.device.type)
    if compute_dtype != "float32":  # bf16 compute gives other values; float32 keys stay those of existing caches
        model_key["compute_dtype"] = compute_dtype
    return refcache.cache_key(ref_path, dtype, pairs_fingerprint(pairs, ctx.task.tokenizer), model_key,
                              path=start_in_key(ctx.cfg, ref_path))


def _precomputed(ctx: RunContext, strategy: ReferenceStrategy, pairs: datasets.Dataset, ref_path: Path, compute):
    """A fixed reference's table of the whole set, loaded or computed now (over the data-parallel ranks);
    the reference model is released afterwards, since every value it could give is in the table."""
    t0 = now(ctx.device)
    key = rdist.decided_by_rank0(lambda: _table_key(ctx, pairs, ref_path))  # file times in the key: rank 0's

    def compute_all() -> RefLogps:
        strategy.ensure_model()
        r, d = rdist.dp_rank_and_degree(ctx.parallel_dims)
        with strategy.resident():  # reference.offload: one move to the device for the whole table
            return refcache.compute_table(compute, len(pairs), ctx.cfg.algo.pairs_per_step, rank=r, degree=d,
                                          dp_sum=partial(rdist.dp_sum, ctx.parallel_dims), device=ctx.device)

    table, built = refcache.load_or_compute(refcache.cache_file(ctx.cache_dir, key), compute_all, num_rows=len(pairs))
    if strategy.model is not None:
        strategy.release_model()  # every value it could give is in the table
        gc.collect()
    return refcache.PrecomputedRefLogps(table), {"refcache/build_s": now(ctx.device) - t0,
                                                 "refcache/built": float(built)}
