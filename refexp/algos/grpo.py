"""GRPO (Shao et al. 2024, DeepSeekMath §4.1, eq. 3) with a pluggable reference strategy: ``GRPOStep`` samples,
scores, computes advantages and updates the policy; ``grpo_metrics.GRPOStepMetrics`` measures what it computed.
The step, its choices and departures: docs/algorithms.md, GRPO.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch

from refexp import titan
from refexp.algos.continued_sft import ContinuedSFTStep
from refexp.algos.grpo_metrics import GRPOStepMetrics, GRPOStepResult, RowCounts, StepRollouts
from refexp.algos.loop import Policy, build_policy, build_strategy, optimizer_step, run_loop
from refexp.algos.microbatch import combine_metrics, row_chunks
from refexp.algos.shared_prompt import SharedPrompt, row_logprobs, share_groups
from refexp.components.context import RunContext
from refexp.components.data_order import batch_ids
from refexp.components.rollout import build_engine, decode_capacity
from refexp.components.timing import now
from refexp.config import GRPOConfig
from refexp.losses import group_advantages, grpo_loss
from refexp.losses.kl import sequence_kl
from refexp.reference.kl_control import AdaptiveKLController, FixedKLController
from refexp.reference.strategies import ReferenceStrategy
from refexp.runtime import distributed as rdist


def _cat_rows(parts: list[torch.Tensor | None]) -> torch.Tensor | None:
    """Per-chunk [b, T-1] results as one [B, T-1] (None when reference-free)."""
    if parts[0] is None:
        return None
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class GRPOStep:
    """The step function of GRPO; state it needs across steps (the KL controller) lives here. It trains;
    ``GRPOStepMetrics`` measures what it computed."""

    def __init__(self, ctx: RunContext, policy: Policy, strategy: ReferenceStrategy):
        self.ctx, self.policy, self.strategy = ctx, policy, strategy
        self.a: GRPOConfig = ctx.cfg.algo
        self.kl_ctl = (AdaptiveKLController(self.a.beta, self.a.kl_target, self.a.kl_horizon)
                       if self.a.kl_target is not None else FixedKLController(self.a.beta))
        self.max_new = self.a.max_new_tokens or ctx.task.max_new_tokens
        self.ratio_vs_trainer = ratio_against_trainer(self.a, ctx.cfg.training.compute_dtype(ctx.device.type))
        self.engine = build_engine(ctx.cfg.rollout, policy.model, ctx.task.tokenizer, capacity=decode_capacity(ctx.cfg))
        self.metrics = GRPOStepMetrics(ctx)

    def __call__(self, step: int, ckpt) -> dict:
        started = now(self.ctx.device)
        rollouts = self._sample(step)
        # training.micro_batch_size: chunks of whole prompt groups (refexp/algos/microbatch.py); the G
        # completions of a prompt share one pass over it (refexp/algos/shared_prompt.py)
        chunks = self._chunks(rollouts.tokens_NT, rollouts.mask_NT)
        ref_logp, ref_s = self._reference_logprobs(rollouts, chunks)
        beta = self.kl_ctl.beta
        shaped, adv = self._advantages(rollouts, ref_logp, beta)
        counts = RowCounts.of(rollouts.mask_NT, self.ctx.parallel_dims)
        update_metrics, ent_sum, trainer_logp = self._update(step, ckpt, chunks, rollouts, ref_logp, adv, beta, counts)
        out = self.metrics(step, GRPOStepResult(rollouts, counts, update_metrics, ent_sum, trainer_logp, ref_logp,
                                                shaped, adv, beta, started, ref_s))
        # the controller sees the global kl/ref, so beta stays the same on every rank
        # and, as in Ziegler et al. 2019 and TRL, it counts samples (the global batch's rows) against kl_horizon
        self.kl_ctl.update(out["kl/ref"] if ref_logp is not None else 0.0, self.a.prompts_per_step * self.a.group_size)
        return out

    def _sample(self, step: int) -> StepRollouts:
        """This rank's prompts of ``step`` (whole groups of the global batch), G completions each from the
        policy as it is now, and their rewards."""
        ctx, a, task = self.ctx, self.a, self.ctx.task
        G, seed = a.group_size, ctx.cfg.training.seed
        ids = batch_ids(len(task.train), a.prompts_per_step, seed, step)[
            rdist.local_slice(ctx.parallel_dims, a.prompts_per_step)]
        rows = task.train.select(ids)
        prompts = [p for p in rows["prompt"] for _ in range(G)]
        answers = [x for x in rows["answer"] for _ in range(G)]
        keys = [(seed, step, pid, g) for pid in ids for g in range(G)]
        t0 = now(ctx.device)
        model = self.policy.model
        model.eval()
        self.engine.load_weights(model)  # the policy after its last update
        rollout = self.engine.generate(prompts, max_new_tokens=self.max_new, temperature=a.temperature,
                                       top_p=a.top_p, keys=keys)
        model.train()
        gen_s = now(ctx.device) - t0
        rewards = torch.tensor(task.score(rollout.texts, answers, prompts), dtype=torch.float32, device=ctx.device)
        gold = task.gold_score(rollout.texts, answers, prompts)  # None unless a learned reward is optimised
        return StepRollouts(rollout, prompts, answers, rollout.tokens_BT.to(ctx.device), rollout.mask_BT.to(ctx.device),
                            rollout.behaviour_logp.to(ctx.device), rewards, gen_s,
                            None if gold is None else torch.tensor(gold, dtype=torch.float32, device=ctx.device))

    def _reference_logprobs(self, rollouts: StepRollouts, chunks) -> tuple[torch.Tensor | None, float]:
        """The reference's log-probs of the rollouts [N, T-1] (None when reference-free), and the seconds taken.
        Tempered like the policy's and the behaviour log-probs (TRL tempers the reference too): at policy ==
        reference the KL is then exactly 0 at any ``algo.temperature``."""
        t1 = now(self.ctx.device)
        tokens, mask = rollouts.tokens_NT, rollouts.mask_NT
        with self.strategy.resident():  # reference.offload: one move to the device for all chunks
            ref_logp = _cat_rows([row_logprobs(self.strategy.logprobs, tokens[sl], mask[sl], shared, select=True,
                                               temperature=self.a.temperature) for sl, shared in chunks])
        return ref_logp, now(self.ctx.device) - t1

    def _advantages(self, rollouts: StepRollouts, ref_logp: torch.Tensor | None, beta: float
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The rewards less ``algo.kl_in_reward``'s KL penalty [N], and their group advantages [N]."""
        a, rewards = self.a, rollouts.rewards_N
        shaped = rewards
        if a.kl_in_reward and ref_logp is not None and beta > 0:
            # k1 whatever algo.kl_estimator says: as a (detached) reward only k1 = log(pi/ref) gives, through the
            # policy gradient, the score-function gradient of KL(pi||ref) (refexp/losses/kl.py; TRL's RLOO does the
            # same)
            shaped = rewards - beta * sequence_kl(rollouts.behaviour_logp_NT, ref_logp, rollouts.mask_NT, "k1")
        # "batch" scaling divides by the std of the global batch (over data-parallel ranks)
        adv = group_advantages(shaped, a.group_size, scale=a.advantage_scale,
                               batch_sum=partial(rdist.dp_sum, self.ctx.parallel_dims))
        return shaped, adv

    def _update(self, step: int, ckpt, chunks, rollouts: StepRollouts, ref_logp: torch.Tensor | None,
                adv: torch.Tensor, beta: float, counts: RowCounts) -> tuple[dict, torch.Tensor, torch.Tensor]:
        """``algo.updates_per_batch`` updates of the policy on the rollouts. Returns the last update's metrics
        (with ``optim/grad_norm``, ``optim/lr``), its entropy sum over completion tokens, and the trainer's
        log-probs of the rollout before the first update [N, T-1]."""
        # Each rank's share of the global aggregate: FSDP sums gradients over ranks (docs/torchtitan-notes.md §5).
        share = (counts.tokens / counts.global_tokens if self.a.loss_agg == "dapo"
                 else counts.rows / counts.global_rows)
        agg: dict[str, float] = {}
        trainer_logp = None  # [N, T-1] the trainer's log-probs of the rollout before this batch's first update
        for _ in range(self.a.updates_per_batch):
            loss, agg, ent_sum, logp_now = self._forward_backward(
                chunks, rollouts.tokens_NT, rollouts.mask_NT, rollouts.behaviour_logp_NT, ref_logp, adv, beta, share,
                trainer_logp)
            trainer_logp = logp_now if trainer_logp is None else trainer_logp
            gn, lr = optimizer_step(self.ctx, self.policy, loss, step, ckpt)
            agg["optim/grad_norm"], agg["optim/lr"] = gn, lr
        return agg, ent_sum, trainer_logp

    def _chunks(self, tokens: torch.Tensor, mask: torch.Tensor) -> list[tuple[slice, SharedPrompt | None]]:
        """This step's row chunks (``training.micro_batch_size`` completions, whole groups) and each
        chunk's shared-prompt layout (None without ``algo.share_prompt``)."""
        a = self.a
        slices = row_chunks(tokens.shape[0], self.ctx.cfg.training.micro_batch_size,
                            multiple=a.group_size if a.share_prompt else 1)
        pad = self.ctx.task.tokenizer.pad_id
        return [(sl, share_groups(tokens[sl], mask[sl], a.group_size, pad) if a.share_prompt else None)
                for sl in slices]

    def _forward_backward(self, chunks, tokens, mask, old_logp, ref_logp, adv, beta: float, share: torch.Tensor,
                          trainer_logp: torch.Tensor | None = None):
        """One update's forwards and backwards over the chunks, gradients accumulated in the policy.

        tokens [N, T]; mask, old_logp (the rollout engine's), ref_logp (or None) [N, T-1]; adv [N]; ``chunks``
        from ``_chunks``; ``trainer_logp`` [N, T-1]: the trainer's log-probs before the batch's first update
        (None on that update: this one's own).

        Each chunk's loss is weighted by its share of the step's aggregate (rows for grpo/dr_grpo,
        completion tokens for dapo) times this rank's ``share`` of the global batch, so the summed
        gradient is the whole batch's. With ``algo.old_logprobs`` resolved to trainer (``ratio_against_trainer``)
        the clipped ratio is taken against ``trainer_logp``; with ``algo.tis_cap`` (truncated importance
        sampling, Yao et al. 2025) too, and each token's policy loss is weighted by
        min(exp(trainer_logp - old_logp), tis_cap). Returns (the whole-batch loss, detached; its metrics,
        combined over chunks as the whole batch's; the entropy summed over completion tokens, a 0-d tensor;
        this update's log-probs [N, T-1], detached).
        """
        a, model = self.a, self.policy.model
        n_rows, n_tok = tokens.shape[0], mask.sum().clamp(min=1).to(torch.float32)
        total = torch.zeros((), device=tokens.device)
        chunk_metrics, weights, ent_sum, logps = [], [], torch.zeros((), device=tokens.device), []
        for sl, shared in chunks:
            m_c = mask[sl]
            logp, entropy = row_logprobs(partial(titan.token_logprobs, model), tokens[sl], m_c, shared, select=True,
                                         temperature=a.temperature, with_entropy=True)
            ratio_base, token_weight = old_logp[sl], None
            if self.ratio_vs_trainer:
                ratio_base = logp.detach() if trainer_logp is None else trainer_logp[sl]
            if a.tis_cap is not None:
                token_weight = torch.exp(ratio_base - old_logp[sl]).clamp(max=a.tis_cap)
            loss, m = grpo_loss(logp, ratio_base, None if a.kl_in_reward or ref_logp is None else ref_logp[sl],
                                adv[sl], m_c, beta=beta, eps_low=a.eps_low, eps_high=a.eps_high,
                                kl_estimator=a.kl_estimator, loss_agg=a.loss_agg,
                                max_completion_length=self.max_new, token_weight=token_weight)
            w_tok = float(m_c.sum()) / float(n_tok)
            w_loss = w_tok if a.loss_agg == "dapo" else (sl.stop - sl.start) / n_rows
            (loss * (w_loss * share)).backward()
            total += loss.detach() * w_loss
            chunk_metrics.append(m)
            weights.append({k: w_loss if k.startswith("loss/") else w_tok for k in m})
            ent_sum = ent_sum + (entropy * m_c).sum()
            logps.append(logp.detach())
        return total, combine_metrics(chunk_metrics, weights), ent_sum, torch.cat(logps)

    # the KL controller is part of the checkpoint (torch Stateful)
    def state_dict(self) -> dict:
        return self.kl_ctl.state_dict()

    def load_state_dict(self, sd: dict) -> None:
        self.kl_ctl.load_state_dict(sd)


def ratio_against_trainer(a: GRPOConfig, compute_dtype: str) -> bool:
    """Whether the clip ratio is taken against the trainer's log-probs of the rollout (``algo.old_logprobs``:
    trainer, or auto in a bfloat16 forward; always with ``algo.tis_cap``) rather than the engine's."""
    if a.tis_cap is not None or a.old_logprobs == "trainer":
        return True
    return a.old_logprobs == "auto" and compute_dtype == "bfloat16"


def train_grpo(ctx: RunContext, sft_dir: Path) -> dict:
    policy = build_policy(ctx, sft_dir)
    strategy, anchor = build_strategy(ctx, sft_dir, policy=policy.model)
    # the continued-SFT baseline: same prompts, no rollouts, no KL controller
    if ctx.cfg.algo.objective == "continued_sft":
        return run_loop(ctx, policy, strategy, anchor, ContinuedSFTStep(ctx, policy), desc="grpo")
    step_fn = GRPOStep(ctx, policy, strategy)
    return run_loop(ctx, policy, strategy, anchor, step_fn, extra_states={"grpo": step_fn}, desc="grpo")
