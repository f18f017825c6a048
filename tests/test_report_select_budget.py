"""Tuning without the oracle (comparison.select.budget) and the oracle's upper bound, on synthetic sweeps: a budget
chooses on the first N validation prompts' per-prompt scores, runs without them are refused rather than read on
the whole split, and the choice made on the test metric itself is reported apart, labelled an upper bound."""

from __future__ import annotations

import json

import numpy as np
import pytest

from refexp.config import ConfigError, SelectionConfig
from refexp.report import build_report
from tests.helpers.frontier_sweeps import PROMPTS, block, write_run

TEST_SOLVED = {0.01: 150, 0.04: 120, 0.2: 100, 1.0: 80}
"""Per beta: test prompts solved (test would choose 0.01)."""
FIRST_50 = {0.01: 10, 0.04: 50, 0.2: 20, 1.0: 10}
WHOLE = {0.01: 100, 0.04: 120, 0.2: 140, 1.0: 80}
"""Per beta: validation prompts right among the first 50, and among all 200: the whole split favours 0.2, its first
50 prompts 0.04."""
BUDGET = 50


def val_scores(beta: float, seed: int, n: int = PROMPTS) -> list[float]:
    """[n] validation scores: FIRST_50[beta] of the first 50 right, the rest of WHOLE[beta] (+ 2 per seed) after."""
    s = np.zeros(n)
    s[:FIRST_50[beta]] = 1.0
    s[BUDGET:BUDGET + WHOLE[beta] - FIRST_50[beta] + 2 * seed] = 1.0
    return s[:n].tolist()


def sweep(root, *, budget=BUDGET, val_prompts=PROMPTS, with_outcomes=True):
    """fixed and ema across four betas, three seeds; ema solves 9, 10, 11 test prompts more in seeds 0, 1, 2."""
    decl = block(["fixed", "ema"], select={"metric": "val/accuracy", "maximize": True, "floor": {},
                                           "budget": budget})
    for seed in (0, 1, 2):
        for arm, more in (("fixed", 0), ("ema", 9 + seed)):
            for beta in TEST_SOLVED:
                scores = val_scores(beta, seed, val_prompts)
                write_run(root, arm, beta, seed, solved=TEST_SOLVED[beta] + more + seed, kl=0.1 / beta, decl=decl,
                          **({"val_outcomes": {"val/accuracy": scores}} if with_outcomes
                             else {"val": float(np.mean(scores))}))


def chosen(report) -> dict:
    return {arm: dict(c.chosen.settings) if c.chosen else None for arm, c in report.frontier.selection.choices.items()}


def test_a_budget_chooses_on_its_first_prompts_where_the_whole_split_would_choose_otherwise(tmp_path):
    sweep(tmp_path / "whole", budget=None)
    assert chosen(build_report(tmp_path / "whole")) == {"fixed": {"algo.beta": "0.2"}, "ema": {"algo.beta": "0.2"}}
    sweep(tmp_path / "budget")
    report = build_report(tmp_path / "budget")
    assert chosen(report) == {"fixed": {"algo.beta": "0.04"}, "ema": {"algo.beta": "0.04"}}
    sel = report.frontier.selection
    assert sel.refused is None and sel.choices["fixed"].chosen.score == pytest.approx(1.0)  # 50 of the first 50
    stated = "read on the first 50 validation prompts only, ids 0-49 of the validation split"
    assert stated in sel.rule and stated in sel.text  # the tuned paragraph states the budget
    assert sel.verdicts["ema (algo.beta=0.04)"].result.point == pytest.approx(10 / PROMPTS)
    md = report.markdown_path.read_text()
    rule = "per arm, the setting with the highest mean final val/accuracy over its seeds"
    assert f"Each arm at its best ({rule}, {stated}" in md
    got = json.loads(report.summary_path.read_text())["frontier"]["selection"]
    assert got["validation_prompts"] == 50 and got["refused"] is None


@pytest.mark.parametrize("case", ["no per-prompt outcomes", "fewer prompts than the budget"])
def test_runs_without_the_budget_s_outcomes_refuse_the_choice(tmp_path, case):
    if case == "no per-prompt outcomes":  # val/accuracy logged, its per-prompt scores not (a run before they were)
        sweep(tmp_path, with_outcomes=False)
        lacking = "24 of 24 runs"
    else:  # every run measured 40 validation prompts
        sweep(tmp_path, val_prompts=40)
        lacking = "24 of 24 runs"
    report = build_report(tmp_path)
    sel = report.frontier.selection
    assert chosen(report) == {"fixed": None, "ema": None} and not sel.verdicts  # no fallback to the whole split
    want = (f"No tuned comparison: comparison.select.budget asks for val/accuracy on the first 50 validation "
            f"prompts, and {lacking} have no per-prompt val/accuracy score for each of them")
    assert sel.refused.startswith(want) and sel.text == sel.refused
    assert "the full validation split is not read in the budget's place" in sel.text
    assert want in report.markdown_path.read_text()
    assert json.loads(report.summary_path.read_text())["frontier"]["selection"]["refused"] == sel.refused


def test_the_oracle_choice_picks_by_test_and_is_labelled_an_upper_bound_apart_from_the_verdicts(tmp_path):
    sweep(tmp_path)
    report = build_report(tmp_path)
    oracle = report.frontier.oracle
    rows = {r.arm: r for r in oracle.rows}
    for arm, more in (("fixed", 1), ("ema", 11)):  # the mean over seeds of the seed's extra prompts
        assert dict(rows[arm].oracle.settings) == {"algo.beta": "0.01"}  # best on test; validation chose 0.04
        assert dict(rows[arm].chosen.settings) == {"algo.beta": "0.04"}
        assert rows[arm].oracle_test == pytest.approx((150 + more) / PROMPTS)
        assert rows[arm].given_up == pytest.approx(30 / PROMPTS)
    md = report.markdown_path.read_text()
    title = "## Oracle choice (uses the test labels: an upper bound, not a result)"
    assert md.index("## Each arm at its best") < md.index(title)
    assert "no verdict is drawn from it (it is in no family and not in the first screen)" in oracle.text
    assert "| fixed | algo.beta=0.01 | 0.755 | algo.beta=0.04 | 0.605 | +0.150 | 4 |" in md
    first_screen = md[md.index("## Primary contrasts"):md.index("## GRPO")]
    assert "oracle" not in first_screen.lower() and "upper bound" not in first_screen
    assert all("0.01" not in k for k in report.frontier.selection.verdicts)  # the tuned family: validation's choice
    summary = json.loads(report.summary_path.read_text())
    assert summary["frontier"]["oracle"]["upper_bound"] is True
    assert summary["frontier"]["oracle"]["label"] == title[3:]
    assert "oracle" not in json.dumps(summary["primary_contrasts"]).lower()


@pytest.mark.parametrize("budget", [0, -5, 2.5, True, "50"])
def test_a_bad_budget_names_the_field(budget):
    with pytest.raises(ConfigError, match=r"comparison.select.budget=.* is invalid: expected a whole number of "
                                          r"validation prompts >= 1"):
        SelectionConfig(metric="val/gold", budget=budget)


def test_a_budget_without_a_select_metric_is_refused():
    with pytest.raises(ConfigError, match=r"comparison.select.budget=50 is invalid: expected null without "
                                          r"comparison.select.metric"):
        SelectionConfig(budget=50)
    assert SelectionConfig(metric="val/gold", budget=50).budget == 50


def test_with_a_budget_the_floors_read_the_budgets_prompts_too(tmp_path):
    """A floor on val/retention (>= 0.5): beta 0.04 keeps 0.8 of the whole split but only 0.2 of its first 50
    prompts, every other beta all of them. Read on the whole split, 0.04 meets the floor and wins on the budget's
    accuracy; read on the budget's prompts, as a user with 50 labels would, it fails and 0.2 wins."""
    def retention(beta):
        s = np.ones(PROMPTS)
        if beta == 0.04:
            s[10:BUDGET] = 0.0  # 10 of the first 50 kept; 160 of 200 in all
        return s.tolist()

    decl = block(["fixed", "ema"], select={"metric": "val/accuracy", "maximize": True, "budget": BUDGET,
                                           "floor": {"val/retention": 0.5}})
    for seed in (0, 1, 2):
        for arm, more in (("fixed", 0), ("ema", 9 + seed)):
            for beta in TEST_SOLVED:
                write_run(tmp_path, arm, beta, seed, solved=TEST_SOLVED[beta] + more + seed, kl=0.1 / beta,
                          decl=decl, val_outcomes={"val/accuracy": val_scores(beta, seed),
                                                   "val/retention": retention(beta)})
    report = build_report(tmp_path)
    assert chosen(report) == {"fixed": {"algo.beta": "0.2"}, "ema": {"algo.beta": "0.2"}}
    cand = next(c for c in report.frontier.selection.choices["fixed"].candidates
                if dict(c.settings) == {"algo.beta": "0.04"})
    assert cand.floors["val/retention"] == pytest.approx(0.2) and not cand.eligible
    assert "the floors read the same prompts" in report.frontier.selection.rule


def test_with_a_budget_a_floor_without_per_prompt_scores_refuses_the_choice(tmp_path):
    decl = block(["fixed", "ema"], select={"metric": "val/accuracy", "maximize": True, "budget": BUDGET,
                                           "floor": {"val/retention": 0.5}})
    for seed in (0, 1, 2):
        for arm in ("fixed", "ema"):
            for beta in TEST_SOLVED:  # val/retention logged as a number only
                write_run(tmp_path, arm, beta, seed, solved=TEST_SOLVED[beta], kl=0.1 / beta, decl=decl,
                          extra={"val/retention": 0.9}, val_outcomes={"val/accuracy": val_scores(beta, seed)})
    sel = build_report(tmp_path).frontier.selection
    assert sel.refused.startswith("No tuned comparison: comparison.select.budget asks for val/retention on the "
                                  "first 50 validation prompts, and 24 of 24 runs have no per-prompt")
