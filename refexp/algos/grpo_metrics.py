"""What one GRPO step computed (``GRPOStepResult``) and the numbers it logs of it (``GRPOStepMetrics``).

The step (refexp/algos/grpo.py) trains; this module measures, as torchtitan's ``train_step`` hands its numbers to
a ``MetricsProcessor``. Every number is the global batch's at any world size (docs/algorithms.md, GRPO).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from refexp.components.context import RunContext
from refexp.components.sampler import Rollout
from refexp.components.timing import now
from refexp.losses.kl import mean_token_kl
from refexp.record.metric_names import REWARD_GOLD
from refexp.runtime import distributed as rdist


@dataclass
class StepRollouts:
    """This rank's samples of one step: N rows = its prompts x ``algo.group_size`` completions, prompt-major.

    rollout:           the engine's result (its texts and completion ids)
    prompts, answers:  per row
    tokens_NT:         [N, T] on the training device; mask_NT, behaviour_logp_NT: [N, T-1] (the engine's log-probs)
    rewards_N:         [N] float32
    gen_s:             seconds spent sampling
    gold_N:            [N] float32 gold rewards (``Task.gold_score``), None when the task logs none
    """

    rollout: Rollout
    prompts: list[str]
    answers: list[str]
    tokens_NT: torch.Tensor
    mask_NT: torch.Tensor
    behaviour_logp_NT: torch.Tensor
    rewards_N: torch.Tensor
    gen_s: float
    gold_N: torch.Tensor | None = None


@dataclass
class RowCounts:
    """This rank's rows and completion tokens (0-d float32 tensors) and the global batch's, summed over the
    data-parallel ranks (one collective each, rows first)."""

    rows: torch.Tensor
    tokens: torch.Tensor
    global_rows: torch.Tensor
    global_tokens: torch.Tensor

    @classmethod
    def of(cls, mask_NT: torch.Tensor, parallel_dims) -> "RowCounts":
        rows = torch.tensor(float(mask_NT.shape[0]), device=mask_NT.device)
        tokens = mask_NT.sum().to(torch.float32)
        return cls(rows, tokens, rdist.dp_sum(parallel_dims, rows), rdist.dp_sum(parallel_dims, tokens))


@dataclass
class GRPOStepResult:
    """What one GRPO step computed, handed to ``GRPOStepMetrics``.

    update_metrics:   the last update's loss metrics (combined over chunks), ``optim/grad_norm``, ``optim/lr``
    entropy_sum:      0-d, the last update's policy entropy summed over completion tokens
    trainer_logp_NT:  [N, T-1] the trainer's log-probs of the rollout before the batch's first update
    ref_logp_NT:      [N, T-1] the reference's, or None (reference-free)
    shaped_N, adv_N:  [N] rewards less the KL penalty (``algo.kl_in_reward``; else the rewards), advantages
    beta:             the KL coefficient the step used
    started:          ``timing.now`` at the step's start; ref_s: seconds of the reference forwards
    """

    rollouts: StepRollouts
    counts: RowCounts
    update_metrics: dict
    entropy_sum: torch.Tensor
    trainer_logp_NT: torch.Tensor
    ref_logp_NT: torch.Tensor | None
    shaped_N: torch.Tensor
    adv_N: torch.Tensor
    beta: float
    started: float
    ref_s: float


class GRPOStepMetrics:
    """The metrics a GRPO step logs, from what it computed: per-rank means combined over the data-parallel
    ranks by their rows or tokens, reward statistics and TRL's counts over the global batch, and a few
    rollouts on the evaluation schedule. Collective (every rank calls it with its own result)."""

    TOKEN_MEANS = ("kl/ref", "clip/low", "clip/high", "clip/ratio", "policy/entropy", "rollout/logprob_diff")
    """Metrics that are means over completion tokens (the rest are means over rows)."""

    def __init__(self, ctx: RunContext):
        self.ctx, self.a = ctx, ctx.cfg.algo

    def __call__(self, step: int, res: GRPOStepResult) -> dict:
        pd = self.ctx.parallel_dims
        local, diff_max = self._local_means(res)
        out = rdist.dp_mean_metrics(pd, local, self._dp_weights(local, res.counts), device=self.ctx.device)
        out["rollout/logprob_diff_max"] = float(rdist.dp_sum(pd, diff_max, op=torch.distributed.ReduceOp.MAX))
        out.update(self._reward_stats(res.rollouts.rewards_N, res.counts.global_rows))
        if res.rollouts.gold_N is not None:  # beside a learned reward: what it stands for (docs/reward-models.md)
            out[REWARD_GOLD] = float(rdist.dp_sum(pd, res.rollouts.gold_N.sum()) / res.counts.global_rows)
        out.update(self._trl_counts(res.rollouts, res.counts.global_rows))
        k = self.ctx.cfg.eval.log_samples
        if k and step % self.ctx.cfg.eval.every == 0:  # a few of this rank's rollouts, on the evaluation schedule
            out["samples/rollout"] = self._samples(res, k)
        return out

    def _local_means(self, res: GRPOStepResult) -> tuple[dict, torch.Tensor]:
        """This rank's means (and timings), and its largest |trainer - rollout| log-prob gap (0-d)."""
        b, n = res.rollouts, res.counts
        mask = b.mask_NT
        # how far the rollout engine's log-probs are from the trainer's on the same tokens and weights
        diff = torch.where(mask, (res.trainer_logp_NT - b.behaviour_logp_NT).abs(), torch.zeros((), device=mask.device))
        diff_sum, diff_max = diff.sum(), diff.max()
        ent = float(res.entropy_sum / mask.sum().clamp(min=1))
        kl_ref = None
        if res.ref_logp_NT is not None:
            kl_ref = float(mean_token_kl(b.behaviour_logp_NT, res.ref_logp_NT, mask))
        out = {
            **res.update_metrics,
            "reward/shaped_mean": float(res.shaped_N.mean()),
            "policy/entropy": ent,
            "policy/completion_len": float(n.tokens) / float(n.rows),
            "perf/gen_s": b.gen_s,
            "perf/ref_fwd_s": res.ref_s,
            "perf/tokens_per_s": float(b.tokens_NT.numel()) / max(now(self.ctx.device) - res.started, 1e-9),
        }
        if kl_ref is not None:  # kl/beta too: without a reference there is no KL term to weigh
            out["kl/ref"], out["kl/beta"] = kl_ref, res.beta
        out["rollout/logprob_diff"] = float(diff_sum / n.tokens.clamp(min=1))
        return out, diff_max

    def _dp_weights(self, metrics: dict, counts: RowCounts) -> dict[str, float]:
        """What each metric is a mean over on this rank, to average it over ranks: token means weigh
        by the rank's completion tokens, row means by its rows (ranks may hold different token
        counts); timings are per rank and not averaged."""
        by_token = set(self.TOKEN_MEANS)
        if self.a.loss_agg == "dapo":  # the loss is a token mean too
            by_token |= {k for k in metrics if k.startswith("loss/")}
        return {k: float(counts.tokens) if k in by_token else float(counts.rows)
                for k in metrics if not k.startswith("perf/")}

    def _reward_stats(self, rewards_N: torch.Tensor, global_rows: torch.Tensor) -> dict[str, float]:
        """``reward/mean`` and ``reward/std`` over the global batch (exact at any world size)."""
        pd = self.ctx.parallel_dims
        s1, s2 = rdist.dp_sum(pd, rewards_N.sum()), rdist.dp_sum(pd, (rewards_N * rewards_N).sum())
        mean = s1 / global_rows
        return {"reward/mean": float(mean), "reward/std": float((s2 / global_rows - mean * mean).clamp(min=0).sqrt())}

    def _trl_counts(self, b: StepRollouts, global_rows: torch.Tensor) -> dict[str, float]:
        """TRL's ``frac_reward_zero_std`` and ``completions/clipped_ratio``, as global counts: a rank holds whole
        groups, so summing its counts over ranks is exact. A group whose rewards are all equal has zero
        advantage (no learning signal); a completion is clipped when it ends without a stop id (it ran to
        the generation budget)."""
        spread = b.rewards_N.view(-1, self.a.group_size)
        zero_std = (spread.max(dim=1).values - spread.min(dim=1).values).abs() <= 1e-8
        stops = set(self.ctx.task.tokenizer.stop_ids)
        clipped = float(sum(not ids or ids[-1] not in stops for ids in b.rollout.completion_ids))
        # one collective for both counts; the global number of groups is algo.prompts_per_step
        zero_groups, clipped_rows = rdist.dp_sum(self.ctx.parallel_dims, torch.stack(
            [zero_std.sum().to(torch.float32), torch.tensor(clipped, device=self.ctx.device)]))
        return {"frac_reward_zero_std": float(zero_groups) / self.a.prompts_per_step,
                "completions/clipped_ratio": float(clipped_rows / global_rows)}

    @staticmethod
    def _samples(res: GRPOStepResult, k: int) -> list[dict]:
        """The first ``k`` rows of this rank: prompt, completion, answer, reward, advantage (and gold, when logged)."""
        b = res.rollouts
        rows = [{"prompt": p, "completion": c, "answer": ans, "reward": float(x), "advantage": float(v)}
                for p, c, ans, x, v in zip(b.prompts[:k], b.rollout.texts[:k], b.answers[:k],
                                           b.rewards_N[:k].tolist(), res.adv_N[:k].tolist())]
        if b.gold_N is not None:
            for row, g in zip(rows, b.gold_N[:k].tolist()):
                row["gold"] = float(g)
        return rows
