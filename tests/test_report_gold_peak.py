"""The gold-peak tables (refexp/report/statistics/gold_peak.py) on synthetic sweeps whose per-prompt gold is known
(tests/helpers/gold_peak_sweeps.py): the peak step is the one validation chooses (the budget's prompts where the
block declares a budget), never test's; the rise from step 0 and each arm against the baseline at their peaks are
read on test, paired by prompt, by hand."""

from __future__ import annotations

import json

import pytest

from refexp.report import build_report
from tests.helpers.frontier_sweeps import block
from tests.helpers.gold_peak_sweeps import write_run

SEEDS = (0, 1, 2)


def _none_run(root, seed, decl, **kw):
    # test gold peaks at step 20 (0.70); validation at step 10: the peak read on test is at 10
    j = 0.01 * seed
    return write_run(root, "none", 1.0, seed, test=[0.5 + j, 0.6 + 2 * j, 0.7, 0.6, 0.1],
                     val=[0.5, 0.8, 0.6, 0.5, 0.1], decl=decl, **kw)


def _peaks(report):
    return report.peaks["grpo"]


def test_the_peak_step_is_chosen_on_validation_and_the_rise_is_read_on_test(tmp_path):
    decl = block(["none"], seeds=SEEDS)
    for seed in SEEDS:
        _none_run(tmp_path, seed, decl)
    report = build_report(tmp_path)
    (row,) = _peaks(report).rows
    assert row.step == 10 and row.val == pytest.approx(0.8)  # not step 20, where test gold peaks
    assert row.start == pytest.approx(0.51) and row.at_peak == pytest.approx(0.62)
    assert row.final == pytest.approx(0.1) and row.kl_init == pytest.approx(0.1)
    v = _peaks(report).verdicts[row.label]
    assert v.result.point == pytest.approx(0.11)  # per seed 0.1 + 0.01 seed: each solves the same prompts more
    assert v.word == "higher"
    md = report.markdown_path.read_text()
    assert "**Gold at its peak.**" in md and "| none | 3 | 10 | 0.100 | 0.510 | 0.620 | +0.110 [" in md
    summary = json.loads(report.summary_path.read_text())["algos"]["grpo"]["gold_peak"]
    assert summary["groups"][0]["peak_step"] == 10 and summary["groups"][0]["verdict"] == "higher"


def test_with_a_budget_the_step_is_chosen_on_the_budgets_prompts_alone(tmp_path):
    # the whole split peaks at step 10, its first 20 prompts at step 30
    budget_curve = [0.5, 0.5, 0.6, 0.9, 0.1]
    for name, select in (("split", None), ("budget", {"metric": "val/gold", "maximize": True, "budget": 20})):
        decl = block(["fixed", "none"], seeds=SEEDS, select=select)  # a valid block: fixed is its baseline
        for seed in SEEDS:
            _none_run(tmp_path / name, seed, decl, val_budget=budget_curve)
    split, budget = (_peaks(build_report(tmp_path / n)) for n in ("split", "budget"))
    assert split.rows[0].step == 10 and "whole validation split" in split.chooser
    assert budget.rows[0].step == 30 and budget.rows[0].val == pytest.approx(0.9)
    assert "first 20 validation prompts" in budget.chooser
    assert budget.rows[0].at_peak == pytest.approx(0.6)


def test_each_arm_at_its_peak_is_compared_with_the_baselines_best_peak(tmp_path):
    decl = block(["fixed", "none"], seeds=SEEDS)
    for seed in SEEDS:
        j = 0.01 * seed
        _none_run(tmp_path, seed, decl)
        # fixed beta 1 peaks on validation at step 40 (test 0.75 + j); beta 0.1 lower on validation throughout
        write_run(tmp_path, "fixed", 1.0, seed, test=[0.5 + j, 0.55, 0.6, 0.7, 0.75 + j],
                  val=[0.5, 0.55, 0.6, 0.7, 0.85], decl=decl)
        write_run(tmp_path, "fixed", 0.1, seed, test=[0.5 + j, 0.9, 0.9, 0.9, 0.9],
                  val=[0.5, 0.6, 0.6, 0.6, 0.6], decl=decl)
    p = _peaks(build_report(tmp_path))
    assert p.baseline == "fixed"
    (arm,) = p.arms
    assert arm.arm == "none" and arm.group.step == 10
    # none at step 10 (0.6 + 0.02 seed) minus fixed beta 1 at step 40 (0.75 + 0.01 seed): -0.15 + 0.01 seed
    assert p.arm_verdicts["none"].result.point == pytest.approx(-0.14)
    assert p.arm_verdicts["none"].word == "lower"
    assert arm.units == [(arm.units[0][0], s) for s in SEEDS]
