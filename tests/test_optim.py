"""The logged ``optim/lr`` is the learning rate the optimizer applied at that step, for every optimizer.

The schedule is torchtitan's linear warm-up then constant (refexp/components/optim.py): update s (1-based)
uses ``lr * s / W`` for s <= W warm-up steps, then ``lr``. The expected values below are that
formula, worked out here rather than read back from the scheduler.
"""

from __future__ import annotations

import pytest
import torch

from refexp.components.optim import NonFiniteError, build_optimizer, clip_and_step
from refexp.record.metrics import read_metrics
from refexp.run import run
from tests.helpers.configs import TINY_GRPO_OVERRIDES, compose_tiny_run

LR, WARMUP, STEPS = 1e-3, 3, 4


def expected_lr(step: int) -> float:
    return LR * min(step, WARMUP) / WARMUP


def _logged_lrs(run_dir) -> dict[int, float]:
    return {r["step"]: r["optim/lr"] for r in read_metrics(run_dir) if r["step"] > 0}


def test_schedule_formula_matches_the_optimizer_in_a_bare_loop():
    """clip_and_step returns the lr the update used: under a constant gradient Adam's bias-corrected
    step m / sqrt(v) is 1, so the weight moves by exactly the lr."""
    w = torch.nn.Linear(1, 1, bias=False, dtype=torch.float64)
    optimizers, schedulers = build_optimizer(w, optimizer="Adam", lr=LR, warmup_steps=WARMUP, total_steps=STEPS)
    for step in range(1, STEPS + 1):
        before = w.weight.detach().clone()
        loss = w(torch.ones(1, 1, dtype=torch.float64)).sum()  # d loss / d w = 1
        loss.backward()
        _, lr = clip_and_step(w, optimizers, schedulers, max_norm=10.0, loss=loss, step=step)
        assert lr == pytest.approx(expected_lr(step), rel=1e-12)
        assert (before - w.weight.detach()).item() == pytest.approx(expected_lr(step), rel=1e-5)


def test_non_finite_loss_is_refused_before_the_update():
    w = torch.nn.Linear(1, 1, bias=False)
    optimizers, schedulers = build_optimizer(w, optimizer="Adam", lr=LR)
    before = w.weight.detach().clone()
    loss = w(torch.ones(1, 1)).sum() * float("nan")
    loss.backward()
    with pytest.raises(NonFiniteError, match="non-finite loss at step 7"):
        clip_and_step(w, optimizers, schedulers, max_norm=1.0, loss=loss, step=7)
    assert torch.equal(w.weight.detach(), before)


def test_grpo_logs_the_lr_of_each_step_with_adam(tmp_path):
    run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, f"training.steps={STEPS}", f"training.lr={LR}",
                    f"training.warmup_steps={WARMUP}", "training.optimizer=Adam"))
    lrs = _logged_lrs(tmp_path)
    assert sorted(lrs) == list(range(1, STEPS + 1))
    for step, lr in lrs.items():
        assert lr == pytest.approx(expected_lr(step), rel=1e-9), step


def test_dpo_logs_the_lr_of_each_step_with_adam(tmp_path):
    run(compose_tiny_run(tmp_path, "algo=dpo", "algo.num_pairs=32", "algo.pairs_per_step=8", f"training.steps={STEPS}",
                    f"training.lr={LR}", f"training.warmup_steps={WARMUP}", "training.optimizer=Adam"))
    lrs = _logged_lrs(tmp_path)
    assert sorted(lrs) == list(range(1, STEPS + 1))
    for step, lr in lrs.items():
        assert lr == pytest.approx(expected_lr(step), rel=1e-9), step
