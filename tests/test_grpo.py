"""GRPO end to end on the tiny config, for every reference strategy."""

from __future__ import annotations

import pytest

from refexp.record.metrics import read_metrics
from refexp.record.status import read_status
from refexp.run import run
from tests.helpers.configs import TINY_GRPO_OVERRIDES, compose_tiny_run

STRATEGY_OVERRIDES = {
    "fixed": [],
    "periodic_reset": ["reference.reset_every=2"],
    "ema": ["reference.alpha=0.5"],
    "kl_triggered": ["reference.kl_threshold=1e-9", "reference.min_gap=2"],
    "none": [],
}


@pytest.mark.parametrize("strategy", list(STRATEGY_OVERRIDES))
def test_grpo_runs_and_logs_the_contract_metrics(tmp_path, strategy):
    final = run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, f"reference={strategy}",
                                 *STRATEGY_OVERRIDES[strategy]))
    rows = read_metrics(tmp_path)
    steps = [r["step"] for r in rows]
    assert steps == [0, 1, 2, 3, 4]
    for key in ("loss/total", "reward/mean", "reward/std", "perf/step_s", "perf/gen_s", "perf/ref_fwd_s",
                "perf/tokens_per_s", "mem/peak_rss_mb", "ref/version", "ref/last_update_step"):
        assert all(key in r for r in rows[1:]), key
    for r in rows[1:]:  # TRL's names (README's metric table)
        assert 0.0 <= r["frac_reward_zero_std"] <= 1.0 and 0.0 <= r["completions/clipped_ratio"] <= 1.0
        if r["reward/std"] == 0.0:  # every reward equal across the batch: every group has zero std
            assert r["frac_reward_zero_std"] == 1.0
    # step 1 samples the tiny SFT model, which scores 0 on every completion, so the check above is exercised
    assert rows[1]["reward/std"] == 0.0 and rows[1]["frac_reward_zero_std"] == 1.0
    assert all("eval/accuracy" in rows[i] and "kl/init" in rows[i] for i in (0, 2, 4))
    assert rows[0]["kl/init"] == pytest.approx(0.0, abs=1e-6)  # the policy starts as the initial model
    if strategy == "none":
        assert not any("kl/ref" in r for r in rows)
    else:
        assert all("kl/ref" in r for r in rows[1:])
    status = read_status(tmp_path)
    assert status["status"] == "completed" and status["final"]["step"] == 4
    assert final["step"] == 4
    assert (tmp_path / "checkpoint" / "step-4" / ".metadata").is_file()


def test_periodic_reset_changes_reference_exactly_every_n_steps(tmp_path, dense_reward):
    run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, "training.steps=7", "reference=periodic_reset",
                         "reference.reset_every=3"))
    rows = {r["step"]: r for r in read_metrics(tmp_path)}
    versions = [rows[s]["ref/version"] for s in range(1, 8)]
    assert versions == [0, 0, 1, 1, 1, 2, 2]
    assert [rows[s]["ref/last_update_step"] for s in (3, 6, 7)] == [3, 6, 6]
    # right after a reset the batch is sampled from the reference's own weights
    assert rows[4]["kl/ref"] == pytest.approx(0.0, abs=1e-6)
    assert rows[7]["kl/ref"] == pytest.approx(0.0, abs=1e-6)
    assert rows[3]["kl/ref"] > 1e-6  # and it had drifted before


def test_reward_function_error_names_the_sample(tmp_path, tiny_grpo_cfg, monkeypatch):
    import refexp.tasks as tasks_mod

    original = tasks_mod.build_task

    def broken(*a, **k):
        task = original(*a, **k)

        def reward(completion, answer):
            raise KeyError("boom")

        task.reward = reward
        return task

    monkeypatch.setattr(tasks_mod, "build_task", broken)
    tiny_grpo_cfg.sft.steps = 0
    with pytest.raises(Exception, match="sample 0"):
        run(tiny_grpo_cfg)
    status = read_status(tmp_path)
    assert status["status"] == "failed" and "boom" in status["error"]


def test_fixed_reference_kl_ref_equals_kl_init_on_the_same_prompts(tmp_path):
    """kl/ref (training-batch path) and kl/init (held-out path) are one quantity when the reference is
    the fixed initial model: the same samples give the same number."""
    import torch

    import refexp.algos.grpo as grpo_mod
    from refexp.algos.loop import build_policy, build_strategy
    from refexp.components import sampler
    from refexp.components.evaluation import KL_INIT_KEY, kl_to_anchor
    from refexp.losses.kl import mean_token_kl

    captured = {}

    def capture(ctx, sft_dir):
        policy = build_policy(ctx, sft_dir)
        with torch.no_grad():  # move the policy away from the reference
            for p in policy.model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        strategy, anchor = build_strategy(ctx, sft_dir)
        assert anchor.shared is strategy  # fixed on the start checkpoint: no second copy
        prompts = ctx.task.eval.select(range(8))["prompt"]
        per_prompt = {}
        with anchor.logprobs() as ref_fn:
            kl_init = kl_to_anchor(policy.model, {"kl/init": ref_fn}, ctx.task, 8,
                                   seed=ctx.cfg.training.seed, per_prompt=per_prompt)["kl/init"]
        # each prompt's linearised contribution (eval_outcomes.jsonl's kl/init scores) averages to the KL
        assert len(per_prompt["kl/init"]) == 8 and len(set(per_prompt["kl/init"])) > 1
        assert sum(per_prompt["kl/init"]) / 8 == pytest.approx(kl_init)
        keys = [(ctx.cfg.training.seed, KL_INIT_KEY, i) for i in range(8)]
        r = sampler.generate(policy.model, ctx.task.tokenizer, prompts, max_new_tokens=ctx.task.max_new_tokens,
                             keys=keys)
        kl_ref = float(mean_token_kl(r.behaviour_logp, strategy.logprobs(r.tokens_BT), r.mask_BT))
        captured.update(kl_init=kl_init, kl_ref=kl_ref)
        return {"step": 0}

    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(grpo_mod, "train_grpo", capture)
    try:
        run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, "reference=fixed"))
    finally:
        monkeypatch.undo()
    assert captured["kl_init"] > 1e-4
    assert captured["kl_ref"] == pytest.approx(captured["kl_init"], rel=1e-5, abs=1e-7)


def _parameter_bytes_alive() -> int:
    import gc

    import torch

    seen, total = set(), 0
    for obj in gc.get_objects():
        if isinstance(obj, torch.nn.Parameter) and id(obj) not in seen:
            seen.add(id(obj))
            total += obj.numel() * obj.element_size()
    return total


@pytest.mark.parametrize("strategy, copies", [("none", 2), ("fixed", 2), ("periodic_reset", 3)])
def test_parameters_held_during_training_steps(tmp_path, monkeypatch, strategy, copies):
    """The policy and the kl/init anchor (built at step 0's measurement and kept, never rebuilt from disk; in
    host memory with reference.offload) are held while the policy trains; a reference is one copy more,
    except the fixed one on the start checkpoint, which is the anchor."""
    import gc

    import refexp.algos.grpo as grpo_mod

    held = []
    gc.collect()
    baseline = _parameter_bytes_alive()  # parameters other tests in this process keep alive
    original = grpo_mod.GRPOStep.__call__

    def counting(self, step, ckpt):
        gc.collect()
        held.append((_parameter_bytes_alive() - baseline, sum(p.numel() * p.element_size()
                                                   for p in self.policy.model.parameters())))
        return original(self, step, ckpt)

    monkeypatch.setattr(grpo_mod.GRPOStep, "__call__", counting)
    run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, "training.steps=2", f"reference={strategy}"))
    assert len(held) == 2
    for alive, policy_bytes in held:
        assert alive == copies * policy_bytes, (strategy, alive, policy_bytes)


def test_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, tiny_grpo_cfg, monkeypatch):
    import refexp.algos.grpo as grpo_mod
    from refexp.algos.loop import NonFiniteError

    real = grpo_mod.grpo_loss
    calls = {"n": 0}

    def poisoned(*a, **k):
        loss, m = real(*a, **k)
        calls["n"] += 1
        return (loss * float("nan") if calls["n"] == 3 else loss), m

    monkeypatch.setattr(grpo_mod, "grpo_loss", poisoned)
    tiny_grpo_cfg.training.steps = 4
    tiny_grpo_cfg.checkpoint.interval = 2
    with pytest.raises(NonFiniteError, match=r"non-finite loss at step 3.*step-2"):
        run(tiny_grpo_cfg)
    assert (tmp_path / "checkpoint" / "step-2" / ".metadata").is_file()
    assert not (tmp_path / "checkpoint" / "step-3").exists()
    status = read_status(tmp_path)
    assert status["status"] == "failed" and "non-finite" in status["error"]


def test_continued_sft_baseline_trains_on_demonstrations_without_rollouts(tmp_path):
    """algo.objective=continued_sft: the same prompts per step, SFT's NLL on their demonstrations; no reward, no KL."""
    from refexp.config import ConfigError, to_object

    with pytest.raises(ConfigError, match="algo.objective=continued_sft .* expected reference=none"):
        to_object(compose_tiny_run(tmp_path / "x", *TINY_GRPO_OVERRIDES, "algo.objective=continued_sft"))
    final = run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, "algo.objective=continued_sft", "reference=none",
                                 "training.steps=6", "training.micro_batch_size=3", "eval.every=3"))
    rows = [r for r in read_metrics(tmp_path) if r["step"] > 0]
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert all(r["loss/total"] == r["loss/sft"] > 0 for r in rows)
    assert not any(k.startswith(("reward", "kl/ref", "rollout/")) for r in rows for k in r)
    assert "eval/accuracy" in final and "kl/init" in final  # measured as every strategy is


def test_several_updates_per_batch_run_to_the_end_on_a_schedule_of_every_update(tmp_path):
    """``algo.updates_per_batch=2``: the LR schedule counts optimizer updates (2 per step), so a 3-step run takes
    its 6 updates and each step logs the LR its last update used under a 6-update warm-up schedule."""
    import torch

    from refexp.components.optim import build_optimizer, current_lr

    steps, updates, warmup = 3, 2, 5
    run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, f"training.steps={steps}", f"algo.updates_per_batch={updates}",
                         f"training.warmup_steps={warmup}"))
    logged = {r["step"]: r["optim/lr"] for r in read_metrics(tmp_path) if r["step"] > 0}
    assert read_status(tmp_path)["status"] == "completed" and sorted(logged) == [1, 2, 3]
    lr = compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES).training.lr
    opt, sched = build_optimizer(torch.nn.Linear(2, 2), optimizer="AdamW", lr=lr, warmup_steps=warmup,
                                 total_steps=steps * updates)
    expected = {}
    for update in range(steps * updates):
        expected[update // updates + 1] = current_lr(opt)  # the step logs its last update's LR
        opt.step()
        sched.step()
    assert logged == pytest.approx(expected, rel=1e-12)
