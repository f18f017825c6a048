"""GRPO's continued-SFT baseline (``algo.objective=continued_sft``, ``reference=none``) trains on the task's
demonstrations: each step's gradient is that of the token-mean NLL of the step's prompts' reference
completions under the policy before the update, not of anything the policy samples."""

from __future__ import annotations

import pytest
import torch

from refexp import titan
from refexp.components.data_order import batch_ids
from refexp.record.metrics import read_metrics
from refexp.run import run
from refexp.tasks.batching import pack_sequences
from tests.helpers.configs import TINY_GRPO_OVERRIDES, compose_tiny_run
from tests.helpers.grad_recording import largest, largest_difference

pytestmark = pytest.mark.numerics  # tests/README.md: run under other CPU kernels too


def demonstrations_nll(model, task, ids: list[int]) -> torch.Tensor:
    """-sum log p(demonstration tokens and eos | prompt) / their number, over the rows ``ids`` of the train split."""
    rows = task.train.select(ids)
    tokens, mask = pack_sequences(task.tokenizer, rows["prompt"], rows["completion"], add_eos=True)
    target = mask[:, 1:]  # log-prob t scores token t + 1
    logp = titan.token_logprobs(model, tokens)
    return -(logp * target).sum() / target.sum()


@pytest.mark.slow
def test_each_step_follows_the_gradient_of_its_demonstrations_nll(tmp_path, monkeypatch):
    """Two steps of 4 prompts in micro-batches of 3 (3 + 1 rows): at each optimizer step, the loss and the
    accumulated gradients equal the demonstrations' NLL and its gradient under the not-yet-updated policy."""
    import refexp.algos.continued_sft as step_mod

    seen = []
    original = step_mod.optimizer_step

    def check(ctx, policy, loss, step, ckpt):
        model, task, a = policy.model, ctx.task, ctx.cfg.algo
        got = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        model.zero_grad()
        want_loss = demonstrations_nll(model, task, batch_ids(len(task.train), a.prompts_per_step,
                                                              ctx.cfg.training.seed, step))
        want_loss.backward()
        want = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        for n, p in model.named_parameters():  # the step goes on with its own gradients
            p.grad.copy_(got[n])
        seen.append((step, float(loss), float(want_loss), largest_difference(got, want) / largest(want)))
        return original(ctx, policy, loss, step, ckpt)

    monkeypatch.setattr(step_mod, "optimizer_step", check)
    run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, "algo.objective=continued_sft", "reference=none",
                         "training.steps=2", "training.micro_batch_size=3", "eval.every=2", "eval.log_samples=0"))
    assert [s[0] for s in seen] == [1, 2]
    for step, loss, want, rel in seen:
        assert abs(loss - want) <= 1e-5 * want, f"step {step}: loss {loss} is not the demonstrations' NLL {want}"
        assert rel <= 1e-4, f"step {step}: gradient differs from the demonstrations' NLL gradient by {rel:.3g}"
    logged = {r["step"]: r["loss/sft"] for r in read_metrics(tmp_path) if r["step"] > 0}
    assert logged[1] == seen[0][1] and logged[2] == seen[1][1]
