"""``comparison.matched.max_gap``, the widest step on the matched axis a curve is read across
(refexp/report/statistics/reading_rules.py): checked before a run and by the report, applied to the primary contrasts
and the secondary table on the matched axis (not the other axis's), every failing replicate counted by reason, and
every compared row's bracket and chord sensitivity printed. The committed over-optimisation study (its runs archive)
reads its EMA contrast across fixed's kl/init 0.087 -> 0.956: with ``max_gap: 2`` it makes no claim."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from refexp.config import ConfigError, MatchedConfig
from refexp.report import build_report
from refexp.report.reading.archive import runs_source
from refexp.report.reading.comparison_plan import block_problem, make_plan
from refexp.report.reading.load import load_sweep
from refexp.report.statistics.declared_matched import declared_matched
from refexp.report.statistics.frontier import chord_point, curves
from refexp.report.statistics.frontier_points import DRIFT_AXIS
from tests.helpers.frontier_sweeps import frontier_sweep

OVEROPT = Path(__file__).resolve().parents[1] / "docs" / "overoptimization_grpo"


def test_max_gap_is_checked_before_a_run_and_by_the_report():
    assert MatchedConfig(at=[0.3], max_gap=2).max_gap == 2
    assert MatchedConfig(axis="eval/retention", at=[0.5], max_gap=0.1).max_gap == 0.1
    with pytest.raises(ConfigError, match=r"comparison\.matched\.max_gap=1 is invalid: expected a ratio > 1"):
        MatchedConfig(at=[0.3], max_gap=1)
    with pytest.raises(ConfigError, match=r"comparison\.matched\.max_gap=0 is invalid: expected a difference > 0"):
        MatchedConfig(axis="eval/retention", at=[0.5], max_gap=0)
    with pytest.raises(ConfigError, match=r"comparison\.matched\.max_gap=True"):
        MatchedConfig(at=[0.3], max_gap=True)
    base = {"arm_key": "grpo_variant", "arms": ["fixed", "ema"], "baseline": "fixed", "seeds": [0, 1],
            "primary": ["ema"], "frontier_key": "algo.beta"}
    assert block_problem({**base, "matched": {"at": [0.3], "max_gap": 2}}) is None
    assert block_problem({**base, "matched": {"axis": "eval/retention", "at": [0.5], "max_gap": 0.5}}) is None
    assert block_problem({**base, "matched": {"at": [0.3], "max_gap": 0.5}}) == (
        "comparison.matched.max_gap=0.5 is invalid: expected a ratio > 1 on the drift axis kl/init, or null")
    assert block_problem({**base, "matched": {"axis": "eval/retention", "max_gap": "wide"}}) == (
        "comparison.matched.max_gap='wide' is invalid: expected a difference > 0 on eval/retention, or null")


def _tables(tmp_path, matched: dict):
    frontier_sweep(tmp_path, gap=5.0, matched=matched)
    report = build_report(tmp_path)
    return {m.axis.key: m for m in report.frontier.matched}


def test_max_gap_bounds_the_secondary_table_on_the_matched_axis_only(tmp_path):
    """The drifter's points (kl/init 2.15 and 14.7) lie between fixed's runs 10x apart (and its own, 10x): a bound of
    5 on kl/init unmatches them there; its eval/retention rows (runs 0.1 apart) stay compared, their text saying that
    axis keeps only the β rule. ema's points lie on runs and stay compared on both."""
    tables = _tables(tmp_path / "five", {"axis": "kl/init", "max_gap": 5})
    kl, ret = tables["kl/init"], tables["eval/retention"]
    drifter = [r for r in kl.rows if r.arm == "drifter"]
    assert [r.result for r in drifter] == [None, None]
    assert drifter[0].no_claim.startswith(
        "not matched at kl/init 2.15: 3 of 3 replicates fail (the baseline gap too wide on kl/init (> 5x) in 3, "
        "drifter gap too wide on kl/init (> 5x) in 3); e.g. the baseline's runs in seed 0 around it sit at kl/init 1 "
        "(β 0.2) and 10 (β 0.04), 10x apart")
    assert all(r.result is not None for r in kl.rows if r.arm == "ema")
    assert "within a factor 5 in the frontier key and within a factor 5 on kl/init (comparison.matched.max_gap)" \
        in kl.text
    assert all(r.result is not None for r in ret.rows)
    assert ("within a factor 5 in the frontier key only: comparison.matched.max_gap bounds the step on kl/init, not "
            "on eval/retention") in ret.text
    wide = _tables(tmp_path / "ten", {"axis": "kl/init", "max_gap": 10})["kl/init"]
    assert all(r.result is not None for r in wide.rows)


def test_max_gap_is_a_difference_on_a_linear_axis(tmp_path):
    """On eval/retention fixed's and the drifter's runs sit 0.1 apart: a bound of 0.05 unmatches the drifter's
    points between them, 0.1 does not; the kl/init table keeps only the β rule."""
    tables = _tables(tmp_path / "tight", {"axis": "eval/retention", "max_gap": 0.05})
    ret = tables["eval/retention"]
    drifter = [r for r in ret.rows if r.arm == "drifter"]
    assert [r.result for r in drifter] == [None, None]
    assert "the baseline gap too wide on eval/retention (> 0.05) in 3" in drifter[0].no_claim
    assert "0.1 apart" in drifter[0].no_claim
    assert all(r.result is not None for r in tables["kl/init"].rows if r.arm == "drifter")
    assert "bounds the step on eval/retention, not on kl/init" in tables["kl/init"].text
    loose = _tables(tmp_path / "loose", {"axis": "eval/retention", "max_gap": 0.1})["eval/retention"]
    assert all(r.result is not None for r in loose.rows)
    assert "within 0.1 on eval/retention (comparison.matched.max_gap)" in loose.text


def test_every_secondary_row_prints_its_bracket_and_the_other_chord(tmp_path):
    """Without a bound every row is compared; each prints where its curves were read and its point estimate with
    the chord in the other scale (the drifter's at kl/init 2.15: fixed read between 1 and 10, 10x apart)."""
    tables = _tables(tmp_path, {})
    kl, ret = tables["kl/init"], tables["eval/retention"]
    row = next(r for r in kl.rows if r.arm == "drifter")
    assert row.brackets == {"fixed": pytest.approx((1.0, 10.0)), "drifter": pytest.approx((10 ** -0.5, 10 ** 0.5))}
    assert row.other_chord is not None and row.other_chord != pytest.approx(kl.verdicts[row.label].result.point)
    assert "drifter at kl/init 2.15: fixed between 1 and 10 (a factor 10 apart), drifter between 0.316 and 3.16" \
        in kl.text
    assert (f"Δ {kl.verdicts[row.label].result.point:+.3f} with the chord in log kl/init, {row.other_chord:+.3f} in "
            f"linear kl/init") in kl.text
    assert "(0.1 apart)" in ret.text and "with the chord in linear eval/retention" in ret.text


@pytest.fixture(scope="module")
def overopt_runs():
    with runs_source(OVEROPT) as where:
        yield load_sweep(where)


def _ema(runs, max_gap=None):
    plan = make_plan(runs)
    if max_gap is not None:
        block = copy.deepcopy(plan.block)
        block["matched"]["max_gap"] = max_gap
        plan = make_plan(runs, block=block)
    primary = declared_matched(runs, plan)
    return plan, primary, next(r for r in primary.rows if r.arm == "ema")


def test_the_committed_ema_contrast_is_read_across_an_11x_step_and_max_gap_2_makes_it_no_claim(overopt_runs):
    plan, primary, ema = _ema(overopt_runs)
    verdict = primary.verdicts[ema.label]
    assert verdict.word == "higher" and verdict.result.point == pytest.approx(0.102, abs=5e-4)  # the committed one
    lo, hi = ema.brackets["fixed"]
    assert (round(lo, 3), round(hi, 3)) == (0.087, 0.956)
    assert "fixed between 0.0873 and 0.956 (a factor 11 apart)" in primary.text
    # the sensitivity line: the chord in linear kl/init gives +0.053 (the audit's number), the log chord the reported
    assert ema.other_chord == pytest.approx(0.053, abs=5e-4)
    assert "Δ +0.102 with the chord in log kl/init, +0.053 in linear kl/init" in primary.text
    cs = curves(overopt_runs, plan, DRIFT_AXIS, "eval/gold")
    seeds = ema.seeds
    assert chord_point(cs["ema"], cs["fixed"], seeds, 0.3, True, "eval/gold") == pytest.approx(verdict.result.point)

    _, bounded, ema = _ema(overopt_runs, max_gap=2)
    assert ema.result is None and ema.label not in bounded.verdicts
    assert ema.no_claim.startswith(  # every replicate counted, both arms, by reason
        "not matched at kl/init 0.3: 6 of 6 replicates fail (the baseline gap too wide on kl/init (> 2x) in 6, ema "
        "gap too wide on kl/init (> 2x) in 6); e.g. the baseline's runs in SFT start ")
    assert "around it sit at kl/init 0.0879 (β 0.5) and 1.03 (β 0.2), 11.7x apart" in ema.no_claim
    reset = next(r for r in bounded.rows if r.arm == "periodic_reset")
    assert ("(the baseline gap too wide on kl/init (> 2x) in 6, periodic_reset outside its runs' range in 5, "
            "periodic_reset gap too wide on kl/init (> 2x) in 1)") in reset.no_claim
    assert "within a factor 2.5 in algo.beta and within a factor 2 on kl/init (comparison.matched.max_gap)" \
        in bounded.text
