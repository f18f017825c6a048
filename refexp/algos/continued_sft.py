"""The continued-SFT baseline of a GRPO comparison (``grpo_variant=continued_sft``, which sets
``algo.objective=continued_sft``): a step beside ``GRPOStep`` that trains the policy on the demonstrations of the
prompts GRPO would sample, with the SFT stage's loss. It runs in the same loop (evaluation, reference strategy,
checkpoints) as GRPO.
"""

from __future__ import annotations

import torch

from refexp import titan
from refexp.algos.loop import Policy, optimizer_step
from refexp.algos.microbatch import row_chunks
from refexp.components.context import RunContext
from refexp.components.data_order import batch_ids
from refexp.components.timing import now
from refexp.losses import sft_loss
from refexp.runtime import distributed as rdist
from refexp.tasks.batching import pack_sequences
from refexp.tasks.data_checks import CONTINUED_SFT, check_targets


class ContinuedSFTStep:
    """The step function of the continued-SFT baseline (no rollouts, no reference, no KL controller)."""

    def __init__(self, ctx: RunContext, policy: Policy):
        check_targets(ctx.cfg.task, ctx.task.train, [CONTINUED_SFT])  # also checked before any model is fetched
        self.ctx, self.policy = ctx, policy
        self.a = ctx.cfg.algo

    def __call__(self, step: int, ckpt) -> dict:
        """The step's prompts (the ones GRPO would sample from) trained on their
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
            logp = titan.token_logprobs(model, tokens[sl], select_BT=target[sl])  # the loss reads only these
            loss, _ = sft_loss(logp, target[sl])
            n_chunk = target[sl].sum().to(torch.float32)
            (loss * n_chunk / n_global).backward()
            nll_sum = nll_sum + loss.detach() * n_chunk
        loss = rdist.dp_sum(pd, nll_sum) / n_global.clamp(min=1)  # the global batch's token mean
        gn, lr = optimizer_step(ctx, self.policy, loss, step, ckpt)
        return {"loss/total": float(loss), "loss/sft": float(loss), "optim/grad_norm": gn, "optim/lr": lr,
                "perf/tokens_per_s": float(tokens.numel()) / max(now(ctx.device) - t0, 1e-9)}
