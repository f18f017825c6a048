"""GRPO end to end on the tiny config, for every reference strategy."""

from __future__ import annotations

import json

import pytest

from refexp.logging import read_metrics
from refexp.run import run
from tests.helpers import GRPO, compose_cfg

STRATEGY_OVERRIDES = {
    "fixed": [],
    "periodic_reset": ["reference.reset_every=2"],
    "ema": ["reference.alpha=0.5"],
    "kl_triggered": ["reference.kl_threshold=1e-9", "reference.min_gap=2"],
    "none": [],
}


@pytest.mark.parametrize("strategy", list(STRATEGY_OVERRIDES))
def test_grpo_runs_and_logs_the_contract_metrics(tmp_path, strategy):
    final = run(compose_cfg(tmp_path, *GRPO, f"reference={strategy}", *STRATEGY_OVERRIDES[strategy]))
    rows = read_metrics(tmp_path / "metrics.jsonl")
    steps = [r["step"] for r in rows]
    assert steps == [0, 1, 2, 3, 4]
    for key in ("loss/total", "reward/mean", "reward/std", "perf/step_s", "perf/gen_s", "perf/ref_fwd_s",
                "perf/tokens_per_s", "mem/peak_rss_mb", "ref/version", "ref/last_update_step"):
        assert all(key in r for r in rows[1:]), key
    assert all("eval/accuracy" in rows[i] and "kl/init" in rows[i] for i in (0, 2, 4))
    assert rows[0]["kl/init"] == pytest.approx(0.0, abs=1e-6)  # the policy starts as the initial model
    if strategy == "none":
        assert not any("kl/ref" in r for r in rows)
    else:
        assert all("kl/ref" in r for r in rows[1:])
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["status"] == "completed" and status["final"]["step"] == 4
    assert final["step"] == 4
    assert (tmp_path / "checkpoint" / "step-4" / ".metadata").is_file()


@pytest.fixture
def dense_reward(monkeypatch):
    """A reward with signal even for a 30-step SFT model (which never gets an answer exactly right):
    the number of '1' digits, so advantages are non-zero and the policy moves."""
    import refexp.tasks as tasks_mod

    original = tasks_mod.build_task

    def build(*a, **k):
        task = original(*a, **k)
        task.reward = lambda completion, answer: float(completion.count("1"))
        return task

    monkeypatch.setattr(tasks_mod, "build_task", build)


def test_periodic_reset_changes_reference_exactly_every_n_steps(tmp_path, dense_reward):
    run(compose_cfg(tmp_path, *GRPO, "training.steps=7", "reference=periodic_reset", "reference.reset_every=3"))
    rows = {r["step"]: r for r in read_metrics(tmp_path / "metrics.jsonl")}
    versions = [rows[s]["ref/version"] for s in range(1, 8)]
    assert versions == [0, 0, 1, 1, 1, 2, 2]
    assert [rows[s]["ref/last_update_step"] for s in (3, 6, 7)] == [3, 6, 6]
    # right after a reset the batch is sampled from the reference's own weights
    assert rows[4]["kl/ref"] == pytest.approx(0.0, abs=1e-6)
    assert rows[7]["kl/ref"] == pytest.approx(0.0, abs=1e-6)
    assert rows[3]["kl/ref"] > 1e-6  # and it had drifted before


def test_reward_function_error_names_the_sample(tmp_path, monkeypatch):
    import refexp.tasks as tasks_mod

    original = tasks_mod.build_task

    def broken(*a, **k):
        task = original(*a, **k)

        def reward(completion, answer):
            raise KeyError("boom")

        task.reward = reward
        return task

    monkeypatch.setattr(tasks_mod, "build_task", broken)
    cfg = compose_cfg(tmp_path, *GRPO, "sft.steps=0")
    with pytest.raises(Exception, match="sample 0"):
        run(cfg)
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["status"] == "failed" and "boom" in status["error"]
