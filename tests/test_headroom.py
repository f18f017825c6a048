"""The task's three splits and the SFT start chosen on validation (docs/headroom-task.md): the demonstrator's
slip touches only SFT's training demonstrations, the default embedded task has train / validation / test,
and the SFT stage stops and selects on validation only, measuring test once on the model it keeps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from refexp.config import TaskConfig
from refexp.record.metrics import read_metrics
from refexp.run import run
from refexp.tasks import build_task
from refexp.tasks.arithmetic import generate_arithmetic, slip_carry
from tests.helpers.configs import compose_root, compose_tiny_run


def test_demo_slip_drops_the_ones_carry_of_that_share_of_training_demonstrations_only():
    cfg = TaskConfig(num_train=4000, num_eval=300, demo_slip=0.85)
    splits = generate_arithmetic(cfg)
    test = splits["test"]
    assert test["completion"] == test["solution"]  # the test split is never touched
    rows = splits["train"].to_list()
    train = [r for r in rows if "+" in r["prompt"]]
    differences = [r for r in rows if "-" in r["prompt"]]  # the default task's other skill: never slipped
    assert len(train) == len(differences) == 2000
    assert all(r["completion"] == r["solution"] == f"{int(r['answer']):03d}" for r in differences)
    for r in train:  # the reward's answer and the solution stay correct
        a, b = r["prompt"][:-1].split("+")
        assert int(r["solution"]) == int(a) + int(b) and r["answer"] == str(int(a) + int(b))

    def carries(r):
        a, b = r["prompt"][:-1].split("+")
        return int(a) % 10 + int(b) % 10 >= 10

    carry = [r for r in train if carries(r)]
    slipped = [r for r in carry if r["completion"] != r["solution"]]
    for r in slipped:  # one digit off: the tens digit written without the ones column's carry
        a, b = (int(x) for x in r["prompt"][:-1].split("+"))
        assert r["completion"] == slip_carry(r["solution"])
        assert r["completion"][:-2] == r["solution"][:-2] and r["completion"][-1] == r["solution"][-1]
        assert int(r["completion"][-2]) == (a // 10 % 10 + b // 10 % 10) % 10  # (a1 + b1) mod 10, no carry in
    assert all(r["completion"] == r["solution"] for r in train if not carries(r))
    share = len(slipped) / len(carry)
    sd = (0.85 * 0.15 / len(carry)) ** 0.5
    assert abs(share - 0.85) < 4 * sd, (share, len(carry))
    # the same problems slip at every generation, and a clean config is untouched
    assert generate_arithmetic(cfg)["train"]["completion"] == splits["train"]["completion"]
    clean = generate_arithmetic(TaskConfig(num_train=4000, num_eval=300))["train"]
    assert clean["completion"] == clean["solution"]


def test_demo_slip_is_refused_where_there_is_no_sum_to_slip():
    with pytest.raises(ValueError, match=r"task.demo_slip.*'\+' in task.ops"):
        TaskConfig(ops=["*"], rl_ops=["*"], demo_slip=0.5)
    with pytest.raises(ValueError, match="task.demo_slip"):
        TaskConfig(demo_slip=1.5)


def test_the_embedded_task_has_three_disjoint_splits_by_default(tmp_path):
    task = build_task(TaskConfig(num_train=4000, num_eval=300), str(tmp_path))
    val = task.sft_validation  # every skill's: RL's and the retained skill's
    assert val is not None and len(val) == 100  # 2.5% of the generated training rows
    assert len(task.demonstrations) == 3900 and len(task.eval) + len(task.retain_eval) == 300
    train, val, test = (set(ds["prompt"]) for ds in (task.demonstrations, val, task.eval))
    test |= set(task.retain_eval["prompt"])
    assert not (train & val) and not (train & test) and not (val & test)
    assert build_task(TaskConfig(num_train=4000, num_eval=300, val_fraction=0), str(tmp_path)).val is None


def test_sft_stops_and_selects_on_validation_and_measures_test_once_on_the_model_it_keeps(tmp_path, monkeypatch):
    """Scripted validation losses 2.0, 1.0, 1.5, 1.6, 1.7 at steps 0..4 with patience 3, at a validation accuracy
    inside the start's band (so the plateau rule is armed): the plateau is reached at step 4, the stage keeps step
    1's weights (the lowest loss) and only then reads test."""
    import refexp.algos.sft as sft_mod

    losses = iter([2.0, 1.0, 1.5, 1.6, 1.7, 9.0, 9.0])
    calls: list[tuple[str, str, int]] = []
    snapshots: dict[int, list[torch.Tensor]] = {}
    steps_seen = []
    real_greedy = sft_mod.greedy_accuracy

    def params(model):
        return [p.detach().clone() for p in model.parameters()]

    def fake_logp(model, task, n, *, parallel_dims=None, split="eval", per_token=False):
        calls.append(("loss", split, len(steps_seen)))
        snapshots[len(snapshots)] = params(model)
        return -next(losses)

    def fake_greedy(model, task, n, *, split="eval", **kw):
        calls.append(("accuracy", split, len(steps_seen)))
        if split == "eval":  # the final test measurement: the kept model is the one validated at step 1
            assert all(torch.equal(a, b) for a, b in zip(params(model), snapshots[1]))
            return real_greedy(model, task, n, split=split, **kw)
        return 0.97  # above the floor of the band (ceiling 1.0 without a slip, less START_BAND)

    real_step = sft_mod.clip_and_step

    def counting_step(*a, **k):
        steps_seen.append(k["step"])
        return real_step(*a, **k)

    monkeypatch.setattr(sft_mod, "logp_correct", fake_logp)
    monkeypatch.setattr(sft_mod, "greedy_accuracy", fake_greedy)
    monkeypatch.setattr(sft_mod, "clip_and_step", counting_step)
    final = run(compose_tiny_run(tmp_path, "algo=sft", "sft.steps=50", "sft.eval_every=1", "sft.min_steps=0",
                            "sft.patience=3", "sft.min_delta=0.01", "sft.seed=7"))
    assert steps_seen == [1, 2, 3, 4]
    splits = [split for _, split, _ in calls]
    # validation (every skill) decides; test read once, last: the RL skill's, then the retained skill's
    assert splits[:-2] == ["sft_validation"] * 10 and splits[-2:] == ["eval", "retain_eval"]
    summary = json.loads((Path(final["sft/dir"]) / "sft.json").read_text())
    assert summary["stopped_by"] == "plateau" and summary["kept_step"] == 1 and summary["steps"] == 4
    assert summary["best_val_loss"] == 1.0
    rows = read_metrics(final["sft/dir"])
    assert [r["sft/val_loss"] for r in rows if "sft/val_loss" in r] == [2.0, 1.0, 1.5, 1.6, 1.7]
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [4]  # under its own name, once
    assert final["eval/accuracy"] == summary["eval_accuracy"]


def test_sft_target_accuracy_reads_validation_not_test(tmp_path, monkeypatch):
    import refexp.algos.sft as sft_mod

    seen = []

    def fake_greedy(model, task, n, *, split="eval", **kw):
        seen.append(split)
        return 0.9 if split == "sft_validation" else 0.1  # test says "not there yet": it must not matter

    monkeypatch.setattr(sft_mod, "greedy_accuracy", fake_greedy)
    final = run(compose_tiny_run(tmp_path, "algo=sft", "sft.steps=50", "sft.eval_every=2", "sft.target_accuracy=0.8",
                            "sft.seed=8"))
    summary = json.loads((Path(final["sft/dir"]) / "sft.json").read_text())
    assert summary["steps"] == 0 and summary["stopped_by"] == "target"
    assert seen == ["sft_validation", "eval", "retain_eval"]
    assert final["eval/accuracy"] == 0.1


def test_sft_target_accuracy_without_a_validation_split_is_refused_by_the_config():
    from refexp.config import to_object

    with pytest.raises(ValueError, match="sft.target_accuracy=0.5 needs a validation split"):
        to_object(compose_root("task.val_fraction=0", "sft.target_accuracy=0.5"))
    assert to_object(compose_root("task.val_fraction=0")).sft.target_accuracy == 1.0  # no rule asked: fine
