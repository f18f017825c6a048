"""Held-out measurements made the same way for every algorithm and strategy.

- ``eval/accuracy``: greedy decoding on the first ``eval.num_prompts`` held-out prompts, mean reward
  (exact match for the embedded task).
- ``kl/init``: KL(policy || frozen initial model) on the first ``eval.kl_prompts`` held-out prompts,
  with one completion per prompt sampled from the policy; the per-token k3 estimator averaged over
  completion tokens (the same estimator and averaging as ``kl/ref``, refexp.kl.mean_token_kl).
  The sampling uniforms are keyed to the prompt only (common random numbers), so successive evals
  differ by the policy, not by sampling noise.

Every rank evaluates the whole held-out set (all ranks must join the sharded forwards anyway),
so the numbers do not depend on the world size.

``evaluate`` makes both for the RL loop; ``InitAnchor`` is the initial model ``kl/init`` is measured
against.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

import torch

from refexp import sampler, titan
from refexp.context import RunContext
from refexp.kl import mean_token_kl

KL_INIT_KEY = 7_777  # a key namespace distinct from training rollouts


def _batches(n: int, size: int):
    for s in range(0, n, size):
        yield slice(s, min(n, s + size))


@torch.no_grad()
def greedy_accuracy(model, task, num_prompts: int, *, batch_size: int = 256) -> float:
    """Mean reward of greedy completions on the held-out split."""
    rows = task.eval.select(range(min(num_prompts, len(task.eval))))
    prompts, answers = rows["prompt"], rows["answer"]
    total = 0.0
    was_training = model.training
    model.eval()
    for sl in _batches(len(prompts), batch_size):
        out = sampler.generate(model, task.tokenizer, prompts[sl], max_new_tokens=task.max_new_tokens, greedy=True)
        total += sum(task.score(out.texts, answers[sl], prompts[sl]))
    model.train(was_training)
    return total / max(1, len(prompts))


@torch.no_grad()
def kl_to_anchor(policy, anchor_logprobs: Callable[[torch.Tensor], torch.Tensor], task, num_prompts: int, *,
                 seed: int, temperature: float = 1.0, batch_size: int = 256) -> float:
    """Mean per-token k3 KL(policy || anchor) over completions sampled from the policy."""
    rows = task.eval.select(range(min(num_prompts, len(task.eval))))
    prompts = rows["prompt"]
    kl_sum, tok_sum = 0.0, 0
    for sl in _batches(len(prompts), batch_size):
        keys = [(seed, KL_INIT_KEY, i) for i in range(sl.start, sl.stop)]
        r = sampler.generate(policy, task.tokenizer, prompts[sl], max_new_tokens=task.max_new_tokens,
                             temperature=temperature, keys=keys)
        pol = titan.token_logprobs(policy, r.tokens_BT, temperature=temperature)
        ref = anchor_logprobs(r.tokens_BT)
        n = int(r.mask_BT.sum())
        kl_sum += float(mean_token_kl(pol, ref, r.mask_BT)) * n
        tok_sum += n
    return kl_sum / max(1, tok_sum)


class InitAnchor:
    """The frozen initial (SFT) model that ``kl/init`` is measured against.

    With ``reference=fixed`` on the start checkpoint it *is* the reference (``shared``, no second
    copy). Otherwise ``build_frozen()`` makes it only for the measurement and it is freed after it, so
    strategies are compared without a resident extra copy (``reference=none`` then holds no frozen
    weights during training steps).
    """

    def __init__(self, build_frozen: Callable[[], torch.nn.Module], shared=None):
        self.build_frozen, self.shared = build_frozen, shared

    @contextmanager
    def logprobs(self):
        """``with anchor.logprobs() as fn:`` ``fn(tokens_BT) -> [B, T-1]`` log-probs under the initial model."""
        if self.shared is not None and self.shared.model is not None:  # None: released (DPO's cache)
            yield self.shared.logprobs
            return
        model = self.build_frozen()

        def fn(tokens_BT):
            with torch.inference_mode():
                return titan.token_logprobs(model, tokens_BT).clone()

        try:
            yield fn
        finally:
            del model


def evaluate(ctx: RunContext, policy: torch.nn.Module, anchor: InitAnchor) -> dict[str, float]:
    """``eval/accuracy`` and ``kl/init`` of ``policy`` with the run's ``eval`` settings."""
    ecfg = ctx.cfg.eval
    out = {"eval/accuracy": greedy_accuracy(policy, ctx.task, ecfg.num_prompts)}
    with anchor.logprobs() as ref_fn:
        out["kl/init"] = kl_to_anchor(policy, ref_fn, ctx.task, ecfg.kl_prompts, seed=ctx.cfg.training.seed)
    return out
