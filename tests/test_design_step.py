"""The design step of ``refexp-report --plan EXPERIMENT --pilot PILOT`` (``refexp/report/power/``): the simulated
P(no claim) tracks a design whose per-replicate failure rate is known; a one-start pilot is refused for a design
whose unit is the start, and a matched design refuses a summary; an archive is a pilot; the committed frontier_test
runs, as a pilot for their own design, predict the "no claim" that happened; the grids an experiment declares
(``comparison.matched.grids``) are checked before a run and by the report, and are the ones simulated."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy.stats import norm

from refexp.config.comparison import ComparisonConfig, MatchedConfig
from refexp.config.errors import ConfigError
from refexp.report.__main__ import main
from refexp.report.power.design import _starts_check, full_plan
from refexp.report.power.detectable import Components
from refexp.report.power.experiment import read_experiment
from refexp.report.power.fit import ArmFit
from refexp.report.power.pilot import Pilot, PilotError
from refexp.report.power.pilot_runs import pilot_dir
from refexp.report.power.simulate import Rules, SimDesign, simulate
from refexp.report.reading.comparison_plan import block_problem
from refexp.report.reading.load import find_run_dirs

ROOT = Path(__file__).resolve().parent.parent


def hand_fit(arm: str, means: list[float], keys: list[float], seed_var: float) -> ArmFit:
    """An arm whose log drift at each β is ``means`` plus a seed effect shared by its runs (no start or run noise),
    its metric flat at 0.5."""
    g = len(keys)
    return ArmFit(arm, True, np.log(keys), np.array(means), np.array(means), np.zeros(g), np.zeros(g), 0.0,
                  seed_var, np.array([0.5]), (-10.0, 0.0), 0.0, 0.0, 1e-4, 4 * g)


@pytest.mark.parametrize("starts,seeds", [(1, 4), (3, 4)])
def test_the_simulated_no_claim_tracks_a_known_per_replicate_failure_rate(starts, seeds):
    # the baseline spans log x -6..0 (never fails); the arm's two runs sit at log x -1 and -4 plus a seed effect
    # b ~ N(0, 1) shared by both: at log x -2.6 it fails ("outside") where -1 + b < -2.6 or -4 + b > -2.6,
    # p = Phi(-1.6) + 1 - Phi(1.4) per replicate, replicates independent (no start variance)
    at = math.exp(-2.6)
    fits = {"fixed": hand_fit("fixed", [0.0, -3.0, -6.0], [0.1, 1.0, 10.0], 0.0),
            "ema": hand_fit("ema", [-1.0, -4.0], [1.0, 2.0], 1.0)}
    design = SimDesign(starts, seeds, {"fixed": [0.1, 1.0, 10.0], "ema": [1.0, 2.0]}, "fixed", ["ema"], [at],
                       Rules(True, 100.0, None), 0.05, 1, 0.05)
    n = 2000
    (c,) = simulate(fits, design, n, seed=3)
    p = norm.cdf(-1.6) + 1 - norm.cdf(1.4)
    expected = 1 - (1 - p) ** (starts * seeds)
    assert abs(c.p_no_claim - expected) < 4 * math.sqrt(expected * (1 - expected) / n), (c.p_no_claim, expected)
    assert set(c.reasons) == {"outside"}


def _pilot(notes: list[str]) -> Pilot:
    return Pilot("pilot", Components(0.0, 0.001, 0.0, None), ["ema - fixed"], 100, notes)


def test_a_one_start_pilot_is_refused_for_a_start_design_and_stated_first_for_a_one_start_one():
    one = _pilot(["one SFT start: the starts' variance is not estimable, taken as 0"])
    six = read_experiment(str(ROOT / "conf" / "experiment" / "frontier_test.yaml"))
    with pytest.raises(PilotError, match="has one SFT start, but frontier_test.yaml runs 6"):
        _starts_check(six, one, Path("pilot"))
    quick = read_experiment(str(ROOT / "conf" / "experiment" / "quickstart.yaml"))
    assert quick.starts == 1
    assert _starts_check(quick, one, Path("pilot")).startswith("Start variance taken as 0")
    assert _starts_check(six, _pilot([]), Path("pilot")) == ""


def test_the_command_refuses_a_one_start_pilot_and_a_summary_for_a_matched_design_in_one_line(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["--plan", "long_horizon_grpo", "--pilot", "docs/compare_refs_grpo/summary.json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("refexp-report: error: --pilot docs/compare_refs_grpo/summary.json "
                                               "has one SFT start"), err
    assert main(["--plan", "frontier_test", "--pilot", "docs/frontier_test/summary.json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs the pilot's per-run curves" in err[0], err


@pytest.mark.parametrize("given", ["docs/frontier_test", "docs/frontier_test/runs.tar.xz"])
def test_a_runs_archive_or_its_dir_is_a_pilot(given):
    with pilot_dir(ROOT / given) as d:
        assert len(find_run_dirs(d)) == 432


@pytest.mark.slow
def test_the_committed_frontier_test_runs_predict_their_own_no_claim(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["--plan", "conf/experiment/frontier_test.yaml", "--pilot", "docs/frontier_test"]) == 0
    out = capsys.readouterr().out
    rows = {line.split(" | ")[0].lstrip("| "): line for line in out.splitlines() if "(declared) |" in line}
    for arm, failed in (("periodic_reset", 14), ("ema", 7)):
        row = rows[f"{arm} - fixed at kl/init 0.065"].split(" | ")
        assert float(row[2]) >= 0.8, row  # P(no claim): high, as happened
        assert row[4].startswith(f"{failed} of 24 fail"), row  # the pilot's own replicates, by the report's rule
    assert "warning: ema - fixed at kl/init 0.065 (frontier): P(no claim)" in out
    assert "## β grids under which the design can answer" in out


@pytest.mark.slow
def test_the_grids_an_experiment_declares_are_the_ones_simulated(tmp_path):
    """comparison.matched.grids: the design step simulates the declared arms' grids (the others the pilot's)."""
    doc = yaml.safe_load((ROOT / "conf" / "experiment" / "frontier_test.yaml").read_text())
    doc["comparison"]["matched"]["grids"] = {"fixed": [0.3, 0.5, 0.7, 1], "ema": [20, 5, 10]}
    (tmp_path / "declared.yaml").write_text(yaml.safe_dump(doc))
    text = full_plan(read_experiment(str(tmp_path / "declared.yaml")), ROOT / "docs" / "frontier_test",
                     "eval/accuracy", sweeps=50)
    assert ("the β grids are the experiment's for fixed, ema (comparison.matched.grids), else the pilot's: "
            "fixed 0.3, 0.5, 0.7, 1; periodic_reset 1, 2, 5, 10, 25; ema 5, 10, 20; 288 runs of these arms") in text


def test_declared_grids_are_checked_before_a_run_and_by_the_report():
    base = {"arm_key": "grpo_variant", "arms": ["fixed", "ema"], "baseline": "fixed", "seeds": [0, 1],
            "primary": ["ema"], "frontier_key": "algo.beta"}
    assert block_problem({**base, "matched": {"at": [0.05], "grids": {"fixed": [0.3, 1], "ema": [5, 10]}}}) is None
    assert block_problem({**base, "matched": {"at": [0.05], "grids": {"emma": [5, 10]}}}) == (
        "comparison.matched.grids={'emma': [5, 10]} is invalid: expected arms of comparison.arms, each with a list of "
        "two or more distinct frontier-key values > 0")
    assert "is invalid" in block_problem({**base, "matched": {"at": [0.05], "grids": {"ema": [5, 5]}}})
    with pytest.raises(ConfigError, match=r"comparison\.matched\.grids=\['emma'\] is invalid: expected arms among"):
        ComparisonConfig(**{**base, "matched": MatchedConfig(at=[0.05], grids={"emma": [5, 10]})})
    with pytest.raises(ConfigError, match=r"comparison\.matched\.grids\.ema=\[5\] is invalid: expected a list of two"):
        MatchedConfig(at=[0.05], grids={"ema": [5]})
