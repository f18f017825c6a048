"""DPO's held-out measurements: ``DPOEval`` (the loop's ``measure``: ``evaluation.evaluate`` plus
``logps/chosen_delta``) and ``heldout_pair_metrics`` (the loss's implicit-reward accuracy and margin on held-out
pairs). What each number means: docs/algorithms.md, DPO.
"""

from __future__ import annotations

from contextlib import ExitStack
from functools import partial

import datasets
import torch

from refexp import titan
from refexp.algos.dpo_reference import pack, reference_sums
from refexp.algos.loop import Policy
from refexp.algos.shared_prompt import pair_logprobs
from refexp.components.context import RunContext
from refexp.components.evaluation import evaluate, reference_logprobs
from refexp.config import DPOConfig
from refexp.losses import preference_loss, sft_loss
from refexp.losses.kl import masked_sum
from refexp.reference.anchor import InitAnchor
from refexp.reference.refcache import RefLogps
from refexp.reference.strategies import ReferenceStrategy
from refexp.runtime import distributed as rdist


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
            logp = pair_logprobs(partial(titan.token_logprobs, policy.model), batch, shared, select=True)  # [2B, T-1]
            ref_logp = None if ref_fn is None else pair_logprobs(ref_fn, batch, shared, select=True)
            b = min(B, real - start)  # real pairs at the front of this batch; the rest is padding
            if b <= 0:
                continue
            seq_B = masked_sum(logp, mask, dim=-1)
            ref = None if ref_logp is None else RefLogps.from_logprobs(ref_logp, mask).select(range(b))
            chosen_nll = sft_loss(logp[:b], mask[:b])[0] if a.uses_chosen_nll else None
            _, m = preference_loss(a, seq_B[:b], seq_B[B:B + b], batch.lengths_B[:b], batch.lengths_B[B:B + b],
                                   *reference_sums(ref), chosen_nll)
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
            logp = pair_logprobs(partial(titan.token_logprobs, self.policy.model), batch, shared,
                                 select=True)  # [2B, T-1]
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

