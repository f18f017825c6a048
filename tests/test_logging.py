"""metrics.jsonl is the contract; W&B gets the same dict; a W&B failure never stops training."""

from __future__ import annotations

import json

import pytest

from refexp.components.metric_logger import MetricLogger
from refexp.config import LoggerConfig
from refexp.record.atomic import write_json_atomic
from refexp.record.metrics import read_metrics
from refexp.record.outcomes import EvalOutcomes, read_outcomes
from tests.helpers.configs import TINY_GRPO_OVERRIDES, compose_tiny_run


def test_metrics_jsonl_has_one_object_per_logged_step(tmp_path):
    log = MetricLogger(tmp_path, wandb_cfg=LoggerConfig(name="none"))
    log.log({"reward/mean": 0.5, "kl/ref": 0.01}, step=1)
    log.log({"reward/mean": 0.75}, step=2)
    log.close()
    assert read_metrics(tmp_path) == [
        {"step": 1, "reward/mean": 0.5, "kl/ref": 0.01}, {"step": 2, "reward/mean": 0.75}]


def test_a_torn_last_line_is_skipped_and_truncate_keeps_earlier_steps(tmp_path):
    log = MetricLogger(tmp_path, wandb_cfg=LoggerConfig(name="none"))
    for s in range(1, 6):
        log.log({"loss/total": float(s)}, step=s)
    log.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "loss/to')  # a kill in the middle of a write
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 5]
    log = MetricLogger(tmp_path, wandb_cfg=LoggerConfig(name="none"))
    log.truncate_after(3)  # a resume from step 3 re-logs 4, 5
    log.log({"loss/total": 40.0}, step=4)
    log.close()
    assert [(r["step"], r["loss/total"]) for r in read_metrics(tmp_path)] == [
        (1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]


def test_an_unregistered_metric_name_is_refused_before_anything_is_written(tmp_path):
    log = MetricLogger(tmp_path, wandb_cfg=LoggerConfig(name="none"))
    with pytest.raises(ValueError, match=r"\['reward/meen'\] are not registered"):
        log.log({"reward/mean": 0.5, "reward/meen": 0.5}, step=1)
    with pytest.raises(ValueError, match="sft/accuracy"):
        log.summary({"sft/accuracy": 0.5})
    log.close()
    assert read_metrics(tmp_path) == []


def test_outcomes_go_to_their_own_file_and_are_truncated_on_resume(tmp_path):
    log = MetricLogger(tmp_path, wandb_cfg=LoggerConfig(name="none"))
    for step in (1, 2, 3):
        log.log({"eval/accuracy": 0.5, "outcomes/eval": EvalOutcomes("eval", "eval/accuracy", [0, 1], [0.0, 1.0])},
                step=step)
    log.truncate_after(1)
    log.close()
    assert read_metrics(tmp_path) == [{"step": 1, "eval/accuracy": 0.5}]
    assert read_outcomes(tmp_path) == [(1, EvalOutcomes("eval", "eval/accuracy", [0, 1], [0.0, 1.0]))]


def test_every_evaluation_records_each_held_out_prompts_score(tmp_path, dense_reward):
    """eval_outcomes.jsonl: one line per evaluation and split, whose mean score is the logged accuracy."""
    from refexp.run import run

    run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, "training.steps=2", "eval.every=1"))
    rows = {r["step"]: r for r in read_metrics(tmp_path)}
    outcomes = read_outcomes(tmp_path)
    measured = [("eval", "eval/accuracy"), ("val", "val/accuracy"), ("retain_eval", "eval/retention"),
                ("retain_val", "val/retention"), ("eval", "eval/pass_at_k"),
                ("eval", "kl/init"), ("eval", "kl/init_exact"), ("retain_eval", "kl/init_retain"),
                ("retain_eval", "kl/init_exact_retain")]  # per-prompt drift: its eval.kl_prompts
    assert [(step, o.split, o.metric) for step, o in outcomes] == [(s, *m) for s in (0, 1, 2) for m in measured]
    for step, o in outcomes:
        # eval.num_prompts; pass@k: its eval.pass_k_prompts (64) capped at the 32 held-out sums of task.num_eval=64;
        # the drift: the tiny run's eval.kl_prompts (8)
        want = 32 if o.metric == "eval/pass_at_k" else 8 if o.metric.startswith("kl/") else 16
        assert o.prompt_ids == list(range(want))
        # a score's own mean; the drift's per-prompt terms are float32 sums (kl_influence)
        rel = 1e-6 if o.metric.startswith("kl/") else 1e-12
        assert sum(o.scores) / len(o.scores) == pytest.approx(rows[step][o.metric], rel=rel)
    assert len({tuple(o.scores) for _, o in outcomes}) > 1  # the dense reward scores prompts apart
    assert not any(k.startswith("outcomes/") for r in rows.values() for k in r)


def test_disabled_logger_writes_nothing(tmp_path):
    log = MetricLogger(tmp_path / "r", enabled=False, wandb_cfg=LoggerConfig())
    log.log({"a": 1.0}, step=1)
    log.close()
    assert not (tmp_path / "r").exists()


def test_wandb_offline_run_gets_the_same_metrics_and_conventions(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    info = {"group": "quickstart/sweep1", "job_type": "periodic_reset", "name": "reference=periodic_reset",
            "tags": ["algo:grpo", "ref:periodic_reset"]}
    log = MetricLogger(tmp_path, wandb_cfg=LoggerConfig(name="wandb", project="refexp-test"),
                       resolved_config={"algo": {"name": "grpo"}}, run_info=info)
    assert log._wandb is not None, "W&B offline init failed"
    run = log._wandb
    assert (run.group, run.job_type, run.name) == ("quickstart/sweep1", "periodic_reset", "reference=periodic_reset")
    assert set(run.tags) == {"algo:grpo", "ref:periodic_reset"}
    assert run.config["algo"]["name"] == "grpo"
    log.log({"reward/mean": 0.5}, step=1)
    log.summary({"eval/accuracy": 0.6})
    log.close()
    assert read_metrics(tmp_path) == [{"step": 1, "reward/mean": 0.5}]
    assert list((tmp_path / "wandb").glob("offline-run-*")), "no offline run dir to `wandb sync`"


def test_wandb_failures_never_stop_training(tmp_path, monkeypatch):
    import wandb

    def broken_init(*a, **k):
        raise RuntimeError("no network")

    monkeypatch.setattr(wandb, "init", broken_init)
    with pytest.warns(UserWarning, match="W&B init failed"):
        log = MetricLogger(tmp_path, wandb_cfg=LoggerConfig(name="wandb"))
    log.log({"reward/mean": 1.0}, step=1)
    log.close()
    assert read_metrics(tmp_path) == [{"step": 1, "reward/mean": 1.0}]


def test_write_json_atomic_replaces_whole_files(tmp_path):
    write_json_atomic(tmp_path / "s.json", {"status": "running"})
    write_json_atomic(tmp_path / "s.json", {"status": "completed"})
    assert json.loads((tmp_path / "s.json").read_text()) == {"status": "completed"}
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]
