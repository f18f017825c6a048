"""GRPO (Shao et al. 2024, DeepSeekMath §4.1, eq. 3) with a pluggable reference strategy.

One step (docs/architecture.md): prompts -> G completions each from the policy (behaviour log-probs) ->
rewards -> group-normalised advantages -> reference log-probs (None when reference-free; a prompt's
G completions share one row in this and the policy forwards, ``algo.share_prompt``) ->
``updates_per_batch`` clipped-surrogate updates with beta*KL(policy||ref) -> the loop's
reference update, eval, log, checkpoint.

Departures and choices:
- The prompt order is a permutation of the train split keyed by (seed, epoch); sampling noise is
  keyed by (seed, step, prompt id, sample id): the global batch is the same at any world size.
  Data-parallel ranks take whole prompt groups, so group statistics never cross ranks.
- ``kl/ref`` is the mean over completion tokens of the k3 estimate on the training batch, the
  same quantity ``kl/init`` measures against the initial model on held-out prompts.
- Reference log-probs are tempered with ``algo.temperature`` like the policy's and the behaviour ones.
- ``algo.kl_in_reward``: the per-sequence k1 KL (sum over tokens of log pi - log ref) times beta is
  subtracted from the reward before advantages (the PPO-RLHF form, Ouyang et al. 2022), and the
  loss then has no KL term; ``algo.kl_estimator`` only chooses the loss term's estimator.
- ``algo.kl_target``: beta follows the adaptive controller of Ziegler et al. 2019 fed with ``kl/ref``,
  counting the global batch's samples against ``algo.kl_horizon``.
- ``algo.objective=sft`` is the continued-SFT baseline: the same prompts per step trained on their
  demonstrations (the SFT stage's NLL), no rollouts, rewards or reference; what GRPO adds is its difference.
- Rollouts come from the configured engine (``refexp/rollout.py``). ``rollout/logprob_diff`` (and ``_max``)
  compare its log-probs with the trainer's first-update log-probs of the same tokens; ``algo.tis_cap`` is
  truncated importance sampling (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
  Off-Policy RL Training"): the clip ratio is taken against the trainer's pre-update log-probs and each
  token's policy loss is weighted by min(pi_trainer / pi_rollout, tis_cap).
- ``training.micro_batch_size``: the reference and policy forwards and the backward run over chunks of
  whole prompt groups, each chunk's loss weighted by its share of the rows (grpo, dr_grpo) or of the
  completion tokens (dapo), so the accumulated gradient and the logged metrics are the whole step's.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch

from refexp import distributed as rdist
from refexp import titan
from refexp.algos.loop import Policy, build_policy, build_strategy, optimizer_step, run_loop
from refexp.algos.microbatch import combine_metrics, row_chunks
from refexp.algos.shared_prompt import SharedPrompt, row_logprobs, share_groups
from refexp.config import GRPOConfig
from refexp.context import RunContext
from refexp.data_order import batch_ids
from refexp.kl import AdaptiveKLController, FixedKLController, mean_token_kl, sequence_kl
from refexp.losses import group_advantages, grpo_loss, sft_loss
from refexp.reference import ReferenceStrategy
from refexp.rollout import build_engine
from refexp.tasks.batching import pack_sequences
from refexp.timing import now


def _cat_rows(parts: list[torch.Tensor | None]) -> torch.Tensor | None:
    """Per-chunk [b, T-1] results as one [B, T-1] (None when reference-free)."""
    if parts[0] is None:
        return None
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class GRPOStep:
    """The step function of GRPO; state it needs across steps (the KL controller) lives here."""

    def __init__(self, ctx: RunContext, policy: Policy, strategy: ReferenceStrategy):
        self.ctx, self.policy, self.strategy = ctx, policy, strategy
        self.a: GRPOConfig = ctx.cfg.algo
        self.kl_ctl = (AdaptiveKLController(self.a.beta, self.a.kl_target, self.a.kl_horizon)
                       if self.a.kl_target is not None else FixedKLController(self.a.beta))
        self.max_new = self.a.max_new_tokens or ctx.task.max_new_tokens
        self.engine = build_engine(ctx.cfg.rollout, policy.model, ctx.task.tokenizer)

    def __call__(self, step: int, ckpt) -> dict:
        if self.a.objective == "sft":
            return self._continued_sft_step(step, ckpt)
        ctx, a, task = self.ctx, self.a, self.ctx.task
        G, seed = a.group_size, ctx.cfg.training.seed
        pd = ctx.parallel_dims
        ids = batch_ids(len(task.train), a.prompts_per_step, seed, step)[rdist.local_slice(pd, a.prompts_per_step)]
        rows = task.train.select(ids)
        prompts = [p for p in rows["prompt"] for _ in range(G)]
        answers = [x for x in rows["answer"] for _ in range(G)]
        keys = [(seed, step, pid, g) for pid in ids for g in range(G)]

        t0 = now(ctx.device)
        model = self.policy.model
        model.eval()
        self.engine.load_weights(model)  # the policy after its last update
        r = self.engine.generate(prompts, max_new_tokens=self.max_new, temperature=a.temperature, top_p=a.top_p,
                                 keys=keys)
        model.train()
        gen_s = now(ctx.device) - t0
        tokens, mask, old_logp = r.tokens_BT.to(ctx.device), r.mask_BT.to(ctx.device), r.behaviour_logp.to(ctx.device)
        rewards = torch.tensor(task.score(r.texts, answers, prompts), dtype=torch.float32, device=ctx.device)

        # training.micro_batch_size: chunks of whole prompt groups (refexp/algos/microbatch.py); the G
        # completions of a prompt share one pass over it (refexp/algos/shared_prompt.py)
        chunks = self._chunks(tokens, mask)
        t1 = now(ctx.device)
        # tempered like the policy's and the behaviour log-probs (TRL tempers the reference too): at policy ==
        # reference the KL is then exactly 0 at any algo.temperature
        with self.strategy.resident():  # reference.offload: one move to the device for all chunks
            ref_logp = _cat_rows([row_logprobs(self.strategy.logprobs, tokens[sl], mask[sl], shared,
                                               temperature=a.temperature) for sl, shared in chunks])
        ref_s = now(ctx.device) - t1

        beta = self.kl_ctl.beta
        shaped = rewards
        if a.kl_in_reward and ref_logp is not None and beta > 0:
            # k1 whatever algo.kl_estimator says: as a (detached) reward only k1 = log(pi/ref) gives, through the
            # policy gradient, the score-function gradient of KL(pi||ref) (refexp/kl.py; TRL's RLOO does the same)
            shaped = rewards - beta * sequence_kl(old_logp, ref_logp, mask, "k1")
        # "batch" scaling divides by the std of the global batch (over data-parallel ranks)
        adv = group_advantages(shaped, G, scale=a.advantage_scale, batch_sum=partial(rdist.dp_sum, pd))

        n_rows = torch.tensor(float(tokens.shape[0]), device=ctx.device)
        n_tok = mask.sum().to(torch.float32)
        g_rows, g_tok = rdist.dp_sum(pd, n_rows), rdist.dp_sum(pd, n_tok)
        # Each rank's share of the global aggregate: FSDP sums gradients over ranks (docs/torchtitan-notes.md §5).
        share = {"grpo": n_rows / g_rows, "dr_grpo": n_rows / g_rows, "dapo": n_tok / g_tok}[a.loss_agg]
        agg: dict[str, float] = {}
        trainer_logp = None  # [N, T-1] the trainer's log-probs of the rollout before this batch's first update
        for _ in range(a.updates_per_batch):
            loss, agg, ent_sum, logp_now = self._forward_backward(chunks, tokens, mask, old_logp, ref_logp, adv,
                                                                  beta, share, trainer_logp)
            trainer_logp = logp_now if trainer_logp is None else trainer_logp
            gn, lr = optimizer_step(ctx, self.policy, loss, step, ckpt)
            agg["optim/grad_norm"], agg["optim/lr"] = gn, lr
        # how far the rollout engine's log-probs are from the trainer's on the same tokens and weights
        diff = torch.where(mask, (trainer_logp - old_logp).abs(), torch.zeros((), device=mask.device))
        diff_sum, diff_max = diff.sum(), diff.max()
        ent = float(ent_sum / mask.sum().clamp(min=1))
        kl_ref = None
        if ref_logp is not None:
            kl_ref = float(mean_token_kl(old_logp, ref_logp, mask))

        out = {
            **agg,
            "reward/shaped_mean": float(shaped.mean()),
            "policy/entropy": ent,
            "policy/completion_len": float(n_tok) / float(n_rows),
            "perf/gen_s": gen_s,
            "perf/ref_fwd_s": ref_s,
            "perf/tokens_per_s": float(tokens.numel()) / max(now(ctx.device) - t0, 1e-9),
        }
        if kl_ref is not None:  # kl/beta too: without a reference there is no KL term to weigh
            out["kl/ref"], out["kl/beta"] = kl_ref, beta
        out["rollout/logprob_diff"] = float(diff_sum / n_tok.clamp(min=1))
        out = rdist.dp_mean_metrics(pd, out, self._dp_weights(out, n_rows, n_tok), device=ctx.device)
        out["rollout/logprob_diff_max"] = float(rdist.dp_sum(pd, diff_max, op=torch.distributed.ReduceOp.MAX))
        # the controller sees the global kl/ref, so beta stays the same on every rank
        # and, as in Ziegler et al. 2019 and TRL, it counts samples (the global batch's rows) against kl_horizon
        self.kl_ctl.update(out["kl/ref"] if kl_ref is not None else 0.0, a.prompts_per_step * G)
        # reward statistics over the global batch (exact at any world size)
        s1, s2 = rdist.dp_sum(pd, rewards.sum()), rdist.dp_sum(pd, (rewards * rewards).sum())
        mean = s1 / g_rows
        out["reward/mean"] = float(mean)
        out["reward/std"] = float((s2 / g_rows - mean * mean).clamp(min=0).sqrt())
        # TRL's frac_reward_zero_std and completions/clipped_ratio, as global counts: a rank holds whole groups,
        # so summing its counts over ranks is exact. A group whose rewards are all equal has zero advantage
        # (no learning signal); a completion is clipped when it ends without a stop id (it ran to max_new_tokens).
        spread = rewards.view(-1, G)
        zero_std = (spread.max(dim=1).values - spread.min(dim=1).values).abs() <= 1e-8
        stops = set(task.tokenizer.stop_ids)
        clipped = float(sum(not ids or ids[-1] not in stops for ids in r.completion_ids))
        # one collective for both counts; the global number of groups is algo.prompts_per_step
        zero_groups, clipped_rows = rdist.dp_sum(
            pd, torch.stack([zero_std.sum().to(torch.float32), torch.tensor(clipped, device=ctx.device)]))
        out["frac_reward_zero_std"] = float(zero_groups) / a.prompts_per_step
        out["completions/clipped_ratio"] = float(clipped_rows / g_rows)
        k = ctx.cfg.eval.log_samples
        if k and step % ctx.cfg.eval.every == 0:  # a few of this rank's rollouts, on the evaluation schedule
            out["samples/rollout"] = [
                {"prompt": p, "completion": c, "answer": ans, "reward": float(x), "advantage": float(v)}
                for p, c, ans, x, v in zip(prompts[:k], r.texts[:k], answers[:k], rewards[:k].tolist(),
                                           adv[:k].tolist())]
        return out

    def _continued_sft_step(self, step: int, ckpt) -> dict:
        """``algo.objective=sft``: the step's prompts (the ones GRPO would sample from) trained on their
        demonstrations with the SFT stage's token-mean NLL, in ``training.micro_batch_size`` chunks; each rank's
        share weighted by its target tokens, so the update is the single-process one."""
        ctx, a, task, pd = self.ctx, self.a, self.ctx.task, self.ctx.parallel_dims
        ids = batch_ids(len(task.train), a.prompts_per_step, ctx.cfg.training.seed, step)
        rows = task.train.select(ids[rdist.local_slice(pd, a.prompts_per_step)])
        t0 = now(ctx.device)
        tokens, mask = pack_sequences(task.tokenizer, rows["prompt"], rows["completion"], add_eos=True)
        tokens, target = tokens.to(ctx.device), mask[:, 1:].to(ctx.device)  # logp[:, t] scores token t+1
        n_local = target.sum().to(torch.float32)
        n_global = rdist.dp_sum(pd, n_local)
        model = self.policy.model
        model.train()
        nll_sum = torch.zeros((), device=ctx.device)
        for sl in row_chunks(tokens.shape[0], ctx.cfg.training.micro_batch_size):
            logp = titan.token_logprobs(model, tokens[sl])
            loss, _ = sft_loss(logp, target[sl])
            n_chunk = target[sl].sum().to(torch.float32)
            (loss * n_chunk / n_global).backward()
            nll_sum = nll_sum + loss.detach() * n_chunk
        loss = rdist.dp_sum(pd, nll_sum) / n_global.clamp(min=1)  # the global batch's token mean
        gn, lr = optimizer_step(ctx, self.policy, loss, step, ckpt)
        return {"loss/total": float(loss), "loss/sft": float(loss), "optim/grad_norm": gn, "optim/lr": lr,
                "perf/tokens_per_s": float(tokens.numel()) / max(now(ctx.device) - t0, 1e-9)}

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
        gradient is the whole batch's. With ``algo.tis_cap`` (truncated importance sampling, Yao et al.
        2025) the clipped ratio is taken against ``trainer_logp`` and each token's policy loss is weighted
        by min(exp(trainer_logp - old_logp), tis_cap). Returns (the whole-batch loss, detached; its metrics,
        combined over chunks as the whole batch's; the entropy summed over completion tokens, a 0-d tensor;
        this update's log-probs [N, T-1], detached).
        """
        a, model = self.a, self.policy.model
        n_rows, n_tok = tokens.shape[0], mask.sum().clamp(min=1).to(torch.float32)
        total = torch.zeros((), device=tokens.device)
        chunk_metrics, weights, ent_sum, logps = [], [], torch.zeros((), device=tokens.device), []
        for sl, shared in chunks:
            m_c = mask[sl]
            logp, entropy = row_logprobs(partial(titan.token_logprobs, model), tokens[sl], m_c, shared,
                                         temperature=a.temperature, with_entropy=True)
            ratio_base, token_weight = old_logp[sl], None
            if a.tis_cap is not None:
                ratio_base = logp.detach() if trainer_logp is None else trainer_logp[sl]
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

    TOKEN_MEANS = ("kl/ref", "clip/low", "clip/high", "clip/ratio", "policy/entropy", "rollout/logprob_diff")
    """Metrics that are means over completion tokens (the rest are means over rows)."""

    def _dp_weights(self, metrics: dict, n_rows: torch.Tensor, n_tok: torch.Tensor) -> dict[str, float]:
        """What each metric is a mean over on this rank, to average it over ranks: token means weigh
        by the rank's completion tokens, row means by its rows (ranks may hold different token
        counts); timings are per rank and not averaged."""
        by_token = set(self.TOKEN_MEANS)
        if self.a.loss_agg == "dapo":  # the loss is a token mean too
            by_token |= {k for k in metrics if k.startswith("loss/")}
        return {k: float(n_tok) if k in by_token else float(n_rows) for k in metrics if not k.startswith("perf/")}

    # the KL controller is part of the checkpoint (torch Stateful)
    def state_dict(self) -> dict:
        return self.kl_ctl.state_dict()

    def load_state_dict(self, sd: dict) -> None:
        self.kl_ctl.load_state_dict(sd)


def train_grpo(ctx: RunContext, sft_dir: Path) -> dict:
    policy = build_policy(ctx, sft_dir)
    strategy, anchor = build_strategy(ctx, sft_dir)
    step_fn = GRPOStep(ctx, policy, strategy)
    return run_loop(ctx, policy, strategy, anchor, step_fn, extra_states={"grpo": step_fn}, desc="grpo")
