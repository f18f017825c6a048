"""The frontier across beta and the matched-drift table on synthetic sweeps (tests/helpers/frontier_sweeps.py):
the interpolation against hand-computed weights, the common range, an arm that dominates at matched drift, and
one that is ahead at every beta only because it drifts more."""

from __future__ import annotations

import math

import numpy as np
import pytest

from refexp.report import build_report
from refexp.report.statistics.frontier import DEFAULT_FRONTIER_GAP, common_range, matched_values, weights
from refexp.report.statistics.frontier_points import Point
from refexp.report.statistics.paired import START_LEVEL
from tests.helpers.frontier_sweeps import BETAS, LEVEL, PROMPTS, block, frontier_sweep, write_run


def test_weights_interpolate_piecewise_linearly_in_log_x():
    xs = [0.01, 0.1, 1.0]
    np.testing.assert_allclose(weights(xs, 10 ** -1.5, log=True), [0.5, 0.5, 0.0])
    np.testing.assert_allclose(weights(xs, 0.2, log=True), [0.0, 1 - math.log10(2), math.log10(2)])
    np.testing.assert_allclose(weights(xs, 0.01, log=True), [1.0, 0.0, 0.0])
    np.testing.assert_allclose(weights(xs, 1.0, log=True), [0.0, 0.0, 1.0])
    np.testing.assert_allclose(weights([0.2, 0.6], 0.3, log=False), [0.75, 0.25])
    with pytest.raises(ValueError, match="outside"):
        weights(xs, 2.0, log=True)


def _curve(*xs):
    return [Point(None, 0.0, x, 0.0) for x in xs]


def test_the_common_range_is_what_every_common_seed_of_both_arms_covers():
    a = {0: _curve(0.01, 0.3, 1.0), 1: _curve(0.02, 0.8), 2: _curve(0.001, 5.0)}
    b = {0: _curve(0.05, 2.0), 1: _curve(0.03, 0.1, 0.5)}  # seed 2 only in a: not a common seed
    assert common_range(a, b) == (0.05, 0.5, [0, 1])
    assert common_range(a, {0: _curve(2.0, 3.0), 1: _curve(2.0, 3.0)}) is None  # no overlap
    assert common_range(a, {0: _curve(0.05, 2.0)}) is None  # one common seed
    assert common_range(a, {0: _curve(0.05), 1: _curve(0.05)}) is None  # a single point is no curve
    np.testing.assert_allclose(matched_values(0.05, 0.5, log=True), [0.05 * 10 ** (1 / 3), 0.05 * 10 ** (2 / 3)])
    np.testing.assert_allclose(matched_values(0.2, 0.8, log=False), [0.4, 0.6])


def test_matched_drift_separates_a_dominating_arm_and_not_one_that_only_drifts_more(tmp_path):
    frontier_sweep(tmp_path, select={"metric": "val/accuracy", "maximize": True, "floor": {}})
    report = build_report(tmp_path)
    drift = next(m for m in report.frontier.matched if m.axis.key == "kl/init")
    rows = {r.label: r for r in drift.rows}
    # ema against fixed: their common range is [0.1, 100], compared at 10^0 and 10^1 (on measured points)
    ema = [r for r in drift.rows if r.arm == "ema"]
    np.testing.assert_allclose([r.x for r in ema], [1.0, 10.0])
    for r in ema:
        v = drift.verdicts[r.label]
        assert v.result.seeds.diffs == pytest.approx((0.095, 0.1, 0.105))
        assert v.result.point == pytest.approx(0.1) and v.word == "higher"
    # drifter against fixed: common range [10^-0.5, 100], compared at 10^(1/3) and 10^(7/6); at 10^(1/3) fixed is
    # 1/3 of the way from 80 to 100 prompts (seed 0), drifter 5/6 of the way from 70 to 90: both 86.67
    drifter = [r for r in drift.rows if r.arm == "drifter"]
    np.testing.assert_allclose([r.x for r in drifter], [10 ** (1 / 3), 10 ** (7 / 6)])
    for r in drifter:
        v = drift.verdicts[r.label]
        assert v.result.point == pytest.approx(0.0, abs=1e-9)
        assert v.interval[0] < 0 < v.interval[1] and v.word == "inconclusive"
    assert len(rows) == 4 and all(v.family_size == 4 for v in drift.verdicts.values())
    # at its best beta (the highest validation accuracy: beta 0.01 for every arm) the drifter is ahead on test
    tuned = report.frontier.selection
    assert tuned.verdicts["drifter (algo.beta=0.01)"].word == "higher"
    # retention is a second axis; every number and plot reaches the files
    assert {m.axis.key for m in report.frontier.matched} == {"kl/init", "eval/retention"}
    assert set(report.frontier.plots) == {"frontier_kl_init", "frontier_eval_retention"}
    md = report.markdown_path.read_text()
    assert "## Frontier across algo.beta" in md and "| drifter | 2.15 |" in md
    assert "report_plots/frontier_kl_init.png" in md and "## Each arm at its best" in md
    assert ("one per algo.beta: the arms are compared at matched drift and each at its best setting (below)"
            in report.tables["grpo"].verdict)


def _drifter_widths(root, kl_noise):
    frontier_sweep(root, kl_noise=kl_noise)
    drift = next(m for m in build_report(root).frontier.matched if m.axis.key == "kl/init")
    rows = [r for r in drift.rows if r.arm == "drifter"]
    return rows, drift, [drift.verdicts[r.label].result.boot.se for r in rows]


def test_the_matched_bootstrap_resamples_each_runs_drift_where_it_was_logged_per_prompt(tmp_path):
    """The same sweep with each run's kl/init logged per prompt (256 prompts, a relative spread of 6 per prompt,
    0.375 on the mean, about 0.16 decades): the drifter's points are read between runs, where a shift in x moves
    the curve (0.1 accuracy per decade), so its bootstrap widens (from about 0.0075 to 0.015); without per-prompt
    drift the x-values are exact, and the text says which."""
    exact_rows, exact, exact_se = _drifter_widths(tmp_path / "exact", None)
    rows, noisy, noisy_se = _drifter_widths(tmp_path / "noisy", 6.0)
    assert not any(r.x_resampled for r in exact_rows) and all(r.x_resampled for r in rows)
    assert all(n > 1.5 * e for n, e in zip(noisy_se, exact_se))
    assert [noisy.verdicts[r.label].result.point for r in rows] == pytest.approx(
        [exact.verdicts[r.label].result.point for r in exact_rows])  # the point estimate is unchanged
    assert "kl/init taken as exact (no per-prompt kl/init logged)" in exact.text
    assert "The bootstrap resamples each run's kl/init prompt by prompt too" in noisy.text


def test_a_matched_point_across_a_gap_in_beta_wider_than_declared_is_not_matched(tmp_path):
    """With the default ``frontier_gap`` (2.5), ema's points (kl/init 1 and 10) lie on runs of both curves and are
    compared; the drifter's (10^(1/3), 10^(7/6)) lie between fixed's runs at beta 0.2 and 0.04, and 0.04 and 0.01
    (5x and 4x apart): no claim, the row says where the baseline has no run, and the family holds only ema's two."""
    frontier_sweep(tmp_path, gap=None)
    report = build_report(tmp_path)
    drift = next(m for m in report.frontier.matched if m.axis.key == "kl/init")
    assert drift.gap == DEFAULT_FRONTIER_GAP == 2.5
    ema = [r for r in drift.rows if r.arm == "ema"]
    assert all(r.result is not None and drift.verdicts[r.label].word == "higher" for r in ema)
    drifter = [r for r in drift.rows if r.arm == "drifter"]
    assert [r.result for r in drifter] == [None, None]
    assert drifter[0].no_claim.startswith("not matched at kl/init 2.15: 3 of 3 replicates fail (the baseline gap "
                                          "too wide in β (> 2.5x) in 3")
    assert "e.g. the baseline has no run between β 0.2 and 0.04 in seed 0" in drifter[0].no_claim
    assert "e.g. the baseline has no run between β 0.04 and 0.01 in seed 0" in drifter[1].no_claim
    assert len(drift.verdicts) == 2 and all(v.family_size == 2 for v in drift.verdicts.values())
    assert "the baseline has no run between β 0.2 and 0.04" in report.markdown_path.read_text()
    assert "not matched" in report.summary_path.read_text()
    # no selection declared: the verdict line points to the matched tables and promises no best-setting section
    verdict = report.tables["grpo"].verdict
    assert "compared at matched drift (below)" in verdict and "best setting" not in verdict
    assert "## Each arm at its best" not in report.markdown_path.read_text()


def test_a_frontier_gap_that_is_no_ratio_is_refused(tmp_path):
    decl = {**block(["fixed", "ema"]), "frontier_gap": 1.0}
    for seed in (0, 1):
        for beta in BETAS:
            for arm in ("fixed", "ema"):
                write_run(tmp_path, arm, beta, seed, solved=100, kl=beta, decl=decl)
    with pytest.raises(ValueError, match="comparison.frontier_gap is 1.0: it must be a number > 1"):
        build_report(tmp_path)


def test_no_frontier_section_without_a_frontier_key(tmp_path):
    decl = {**block(["fixed", "ema"]), "frontier_key": ""}
    for seed in (0, 1):
        for arm in ("fixed", "ema"):
            write_run(tmp_path, arm, 1.0, seed, solved=100, kl=0.1, decl=decl)
    report = build_report(tmp_path)
    assert report.frontier is None and "Frontier across" not in report.markdown_path.read_text()


def test_a_setting_every_run_shares_is_no_curve_and_one_swept_within_an_arm_is_its_own(tmp_path):
    """``debug=fast`` on every job tells nothing apart; ``reference.reset_every`` swept within one arm makes two
    curves, each compared with the baseline."""
    decl = block(["fixed", "periodic_reset"])
    for seed in (0, 1):
        for beta in BETAS:
            i = LEVEL[beta]
            write_run(tmp_path, "fixed", beta, seed, solved=60 + 20 * i, kl=10 ** (i - 1), decl=decl,
                      overrides=("debug=fast",))
            for every in (20, 100):
                write_run(tmp_path, "periodic_reset", beta, seed, solved=60 + 20 * i + (every == 20) * 20,
                          kl=10 ** (i - 1), decl=decl, overrides=("debug=fast", f"reference.reset_every={every}"))
    drift = build_report(tmp_path).frontier.matched[0]
    points = {r.label: r.result.point for r in drift.rows}
    assert points == pytest.approx({"periodic_reset (reference.reset_every=100) at kl/init 1": 0.0,
                                    "periodic_reset (reference.reset_every=100) at kl/init 10": 0.0,
                                    "periodic_reset (reference.reset_every=20) at kl/init 1": 0.1,
                                    "periodic_reset (reference.reset_every=20) at kl/init 10": 0.1})


def test_two_sft_starts_pair_by_start_and_seed_in_the_matched_table_and_the_tuned_comparison(tmp_path):
    """Seed s from two starts is two replicates, not one curve: start 1 drifts twice as far at every beta and ema's
    lead over fixed is 20 prompts from start 0, 30 from start 1. Matched drift and the tuned comparison pair by
    (start, seed), and their t is over the two per-start mean differences (0.10 and 0.15)."""
    decl = block(["fixed", "ema"], select={"metric": "val/accuracy", "maximize": True, "floor": {}})
    for start in (0, 1):
        for seed in (0, 1, 2):
            for beta in BETAS:
                i = LEVEL[beta]
                for arm, more in (("fixed", 0), ("ema", 20 + 10 * start)):
                    solved = 60 + 20 * i + 2 * seed + more
                    write_run(tmp_path, arm, beta, seed, solved=solved, kl=10 ** (i - 1) * (1 + start), decl=decl,
                              val=solved / PROMPTS, overrides=(f"sft.seed={start}",))
    report = build_report(tmp_path)
    drift = next(m for m in report.frontier.matched if m.axis.key == "kl/init")
    assert len(drift.rows) == 2
    for r in drift.rows:
        assert r.seeds == [(f"sft.seed={s}", seed) for s in (0, 1) for seed in (0, 1, 2)]
        v = drift.verdicts[r.label]
        assert v.result.seeds.unit == START_LEVEL and v.result.seeds.diffs == pytest.approx((0.10, 0.15))
        assert v.result.levels == (START_LEVEL, "seed", "prompt")
    tuned = report.frontier.selection.verdicts["ema (algo.beta=0.01)"]
    assert tuned.result.seeds.diffs == pytest.approx((0.10, 0.15)) and tuned.result.point == pytest.approx(0.125)
    # within each start, conditional on it: its seeds are the units
    inside = report.frontier.within["sft.seed=1"]
    m = next(m for m in inside.matched if m.axis.key == "kl/init")
    assert len(m.verdicts) == 2
    assert all(v.result.seeds.unit == "seed" and v.result.point == pytest.approx(0.15) for v in m.verdicts.values())
    assert inside.selection.verdicts["ema (algo.beta=0.01)"].result.point == pytest.approx(0.15)
    assert "## Within SFT start sft.seed=0" in report.markdown_path.read_text()
