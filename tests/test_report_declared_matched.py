"""The primary contrasts declared at matched drift (``comparison.matched``, refexp/report/statistics/
declared_matched.py) on the synthetic frontier sweep of tests/helpers/frontier_sweeps.py: tested where the block
says, not where the data fall; Holm over them alone with the equivalence margin; on the first screen; never
extrapolated; the block's fields checked before a run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from refexp.config import ComparisonConfig, ConfigError, MatchedConfig
from refexp.report import build_report
from refexp.report.reading.comparison_plan import make_plan
from refexp.report.reading.load import load_sweep
from refexp.report.statistics import declared_matched, frontier
from tests.helpers.frontier_sweeps import block, frontier_sweep, write_run

X = 10 ** (1 / 3)
"""A kl/init inside every curve's range, between runs on each side (fixed: beta 0.2 -> 1, 0.04 -> 10)."""


def declared(at, margin=0.05, primary=("ema", "drifter")):
    return {"primary": list(primary), "matched": {"axis": "kl/init", "at": list(at)},
            "equivalence_margin": margin}


def test_the_primary_contrasts_are_tested_at_the_declared_drift_and_decide_the_first_screen(tmp_path):
    """ema sits 0.1 above fixed's frontier, the drifter on it: at the declared kl/init the first is higher, the
    second equivalent within the margin, in one Holm family of two (the secondary matched table has its own)."""
    frontier_sweep(tmp_path, **declared([X]))
    report = build_report(tmp_path)
    primary = report.frontier.primary
    assert [(r.arm, r.x) for r in primary.rows] == [("ema", X), ("drifter", X)]
    ema, drifter = (primary.verdicts[r.label] for r in primary.rows)
    assert ema.family_size == drifter.family_size == 2
    assert ema.result.point == pytest.approx(0.1) and ema.word == "higher"
    assert drifter.result.point == pytest.approx(0.0, abs=1e-9) and drifter.word == "equivalent within ±0.05"
    # where fixed's curve was read: between its runs at beta 0.2 (kl/init 1) and 0.04 (10), a chord across a factor 10
    assert primary.rows[0].brackets["fixed"] == pytest.approx((1.0, 10.0))
    assert "ema at kl/init 2.15: fixed between 1 and 10 (a factor 10 apart)" in primary.text
    secondary = next(m for m in report.frontier.matched if m.axis.key == "kl/init")
    assert all(v.family_size == 4 for v in secondary.verdicts.values())  # its own family, at its own points

    md = report.markdown_path.read_text()
    first = md.split("\n## ", 2)[1]
    assert "each against fixed's frontier across algo.beta at kl/init 2.15, on eval/accuracy" in first
    rows = [line for line in first.splitlines() if line.startswith("| ") and "−" in line]
    assert rows == [
        f"| ema − fixed's frontier | final eval/accuracy at matched kl/init 2.15 | {ema.result.point:+.3f} | "
        f"{ema.interval_text} (97.5%) | higher | ±{ema.mdd:.3f} |",
        f"| drifter − fixed's frontier | final eval/accuracy at matched kl/init 2.15 | {drifter.result.point:+.3f} | "
        f"{drifter.interval_text} (97.5%) | equivalent within ±0.05 | ±{drifter.mdd:.3f} |"]
    assert "## Primary contrasts at matched kl/init" in md
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [p["verdict"] for p in summary["primary_contrasts"]] == ["higher", "equivalent within ±0.05"]
    assert summary["frontier"]["primary"]["rows"][0]["detectable_difference_80"] == pytest.approx(ema.mdd)


def test_a_declared_drift_outside_what_the_runs_reached_makes_no_claim_and_still_counts_in_the_family(tmp_path):
    """fixed's runs reach kl/init 0.1 at the least (beta 1): at a declared 0.05 nothing is extrapolated, and the
    contrast that could not be made keeps its share of alpha (Holm over 2, as declared)."""
    frontier_sweep(tmp_path, **declared([0.05, X], primary=["ema"]))
    report = build_report(tmp_path)
    primary = report.frontier.primary
    low, high = primary.rows
    assert low.x == 0.05 and low.result is None and high.x == X
    assert low.no_claim == (  # every replicate of both curves counted, the first one's range named
        "not matched at kl/init 0.05: 3 of 3 replicates fail (the baseline outside its runs' range in 3, ema outside "
        "its runs' range in 3); e.g. the baseline's runs in seed 0 reached kl/init 0.1 to 100; a matched value is "
        "never extrapolated")
    assert list(primary.verdicts) == [high.label] and primary.verdicts[high.label].family_size == 2
    first = report.markdown_path.read_text().split("\n## ", 2)[1]
    assert ("| ema − fixed's frontier | final eval/accuracy at matched kl/init 0.05 |  |  | no claim (not matched"
            in first)


def test_a_no_claim_counts_the_replicates_whose_runs_did_not_reach_the_declared_drift(tmp_path):
    """ema's extra runs at beta 5 reach kl/init 0.03 in seeds 0 and 1: at a declared 0.05 only seed 2's ema runs
    fall short, and the reason counts that one replicate of three (the baseline's, short in all three, too)."""
    decl = {**block(["fixed", "ema", "drifter"], gap=5.0), **declared([0.05, X], primary=["ema"])}
    frontier_sweep(tmp_path, **declared([0.05, X], primary=["ema"]))
    for seed in (0, 1):
        write_run(tmp_path, "ema", 5.0, seed, solved=60, kl=0.03, decl=decl)
    low = build_report(tmp_path).frontier.primary.rows[0]
    assert low.result is None and low.no_claim.startswith(
        "not matched at kl/init 0.05: 3 of 3 replicates fail (the baseline outside its runs' range in 3, ema outside "
        "its runs' range in 1); e.g. the baseline's runs in seed 0 reached kl/init 0.1 to 100")


def _extrapolating(weights):
    """``frontier.weights`` that extrapolates the end segment past a curve's runs instead of refusing: with it (and
    ``_tolerant``) the interpolation's own guards cannot stand in for the rule that a declared value outside the runs
    makes no claim."""
    def extrapolated(xs, x, log):
        t = np.log(np.asarray(xs, dtype=float)) if log else np.asarray(xs, dtype=float)
        tx = math.log(x) if log else x
        if t[0] - 1e-12 <= tx <= t[-1] + 1e-12:
            return weights(xs, x, log)
        j = 0 if tx < t[0] else len(xs) - 2
        w = np.zeros(len(xs))
        share = (tx - t[j]) / (t[j + 1] - t[j])
        w[j], w[j + 1] = 1.0 - share, share
        return w
    return extrapolated


def _tolerant(bracket):
    """``declared_matched.bracket`` that gives (nan, nan) where no run lies on one side of x, instead of raising."""
    def tolerant(curve, seeds, x):
        try:
            return bracket(curve, seeds, x)
        except ValueError:
            return math.nan, math.nan
    return tolerant


@pytest.mark.parametrize("short", ["ema", "the baseline"])
def test_a_declared_drift_outside_one_curves_runs_makes_no_claim_naming_that_curve(tmp_path, monkeypatch, short):
    """The other curve's extra runs at beta 5 reach kl/init 0.03 in every seed, so at a declared 0.05 only ``short``'s
    runs (0.1 to 100) fall short: the contrast makes no claim and says so, even where an interpolation would
    extrapolate rather than fail."""
    monkeypatch.setattr(frontier, "weights", _extrapolating(frontier.weights))
    monkeypatch.setattr(declared_matched, "bracket", _tolerant(declared_matched.bracket))
    decl = {**block(["fixed", "ema", "drifter"], gap=5.0), **declared([0.05, X], primary=["ema"])}
    frontier_sweep(tmp_path, **declared([0.05, X], primary=["ema"]))
    for seed in (0, 1, 2):
        write_run(tmp_path, "fixed" if short == "ema" else "ema", 5.0, seed, solved=60, kl=0.03, decl=decl)
    runs = load_sweep(tmp_path)
    low, high = declared_matched.declared_matched(runs, make_plan(runs)).rows  # the statistics alone: nothing written
    assert low.x == 0.05 and low.result is None and high.result is not None
    assert low.no_claim == (
        f"not matched at kl/init 0.05: 3 of 3 replicates fail ({short} outside its runs' range in 3); e.g. {short}'s "
        f"runs in seed 0 reached kl/init 0.1 to 100; a matched value is never extrapolated")


def _non_monotone_sweep(root, along: str, ema_beta_1_kl: float = 0.1) -> None:
    """fixed's drift falls with beta (3, 0.5, 0.1 at beta 0.2, 0.5, 1); ema's does not: 2, 5, 0.1, so sorted by drift
    its runs nearest kl/init 1 are beta 1 and 0.2 (5x apart), while walked along beta it crosses 1 between 0.5 and 1.
    ema solves 10 + seed prompts more than fixed at every beta."""
    decl = {**block(["fixed", "ema"], gap=2.5), "primary": ["ema"], "equivalence_margin": 0.05,
            "matched": {"axis": "kl/init", "at": [1.0], "along": along}}
    for seed in (0, 1, 2):
        for beta, kl_fixed, kl_ema, solved in ((0.2, 3.0, 2.0, 150), (0.5, 0.5, 5.0, 120),
                                               (1.0, 0.1, ema_beta_1_kl, 90)):
            write_run(root, "fixed", beta, seed, solved=solved + seed, kl=kl_fixed, decl=decl)
            write_run(root, "ema", beta, seed, solved=solved + 10 + 2 * seed, kl=kl_ema, decl=decl)


def test_matched_along_the_key_reads_a_curve_whose_drift_is_not_monotone_in_beta(tmp_path):
    """Declared along: key, each replicate's curve is read between the neighbours on the beta grid that cross the
    value (ema: beta 0.5 and 1, 2x apart); along the axis (the default) the same runs are not matched, their drift
    neighbours beta 1 and 0.2 being 5x apart, past the declared gap."""
    _non_monotone_sweep(tmp_path / "key", "key")
    row = build_report(tmp_path / "key").frontier.primary.rows[0]
    assert not row.no_claim and row.result is not None
    # at kl/init 1 ema is read 2/3 of the way (in log drift) from beta 0.5 to beta 1 after walking the grid, fixed
    # halfway from beta 0.5 (kl 0.5) to beta 0.2 (kl 3) by log distance: the point estimate is their difference
    f_ema, f_fixed = math.log(1 / 5.0) / math.log(0.1 / 5.0), math.log(1 / 0.5) / math.log(3.0 / 0.5)
    ema = [(120 + 10 + 2 * s) * (1 - f_ema) + (90 + 10 + 2 * s) * f_ema for s in (0, 1, 2)]
    fixed = [(120 + s) * (1 - f_fixed) + (150 + s) * f_fixed for s in (0, 1, 2)]
    assert row.result.point == pytest.approx((sum(ema) - sum(fixed)) / 3 / 200, abs=1e-9)
    assert "neighbouring on the algo.beta grid whose kl/init straddle that value" in \
        build_report(tmp_path / "key").frontier.primary.text
    # the secondary matched table reads the same way: at its data-placed points (kl/init 0.31 and 0.96 of the common
    # range 0.1-3) ema is compared along beta, and not along the drift axis
    secondary = build_report(tmp_path / "key").frontier.matched[0]  # the kl/init table
    assert secondary.axis.key == "kl/init"
    assert [r.result is not None for r in secondary.rows] == [True, True], [r.no_claim for r in secondary.rows]
    _non_monotone_sweep(tmp_path / "axis", "axis")
    report = build_report(tmp_path / "axis")
    row = report.frontier.primary.rows[0]
    assert row.result is None and "ema has no run between β 1 and 0.2" in row.no_claim
    assert all(r.result is None and "ema has no run between β 1 and 0.2" in r.no_claim
               for r in report.frontier.matched[0].rows)


def test_matched_along_the_key_makes_no_claim_where_a_replicates_path_never_crosses(tmp_path):
    _non_monotone_sweep(tmp_path, "key", ema_beta_1_kl=1.5)  # ema's path now stays above kl/init 1 at every beta
    row = build_report(tmp_path).frontier.primary.rows[0]
    # a path through every run spans their range, so one that never crosses the value ended outside it
    assert row.result is None and row.no_claim == (
        "not matched at kl/init 1: 3 of 3 replicates fail (ema outside its runs' range in 3); e.g. ema's runs in "
        "seed 0 reached kl/init 1.5 to 5; a matched value is never extrapolated")


def test_the_matched_block_is_checked_before_a_run():
    base = dict(arm_key="grpo_variant", arms=["fixed", "ema", "none"], baseline="fixed", seeds=[0, 1],
                primary=["ema"], frontier_key="algo.beta")
    assert ComparisonConfig(**base, matched=MatchedConfig(at=[0.06])).matched.declared
    assert ComparisonConfig(**base, matched=MatchedConfig(at=[0.06], along="key")).matched.along == "key"
    with pytest.raises(ConfigError, match=r"comparison\.matched\.along='beta' is invalid: expected axis or key"):
        MatchedConfig(at=[0.06], along="beta")
    from refexp.report.reading.comparison_plan import block_problem  # a run's saved block, read by the report
    assert block_problem({**base, "matched": {"at": [0.06], "along": "beta"}}) == (
        "comparison.matched.along='beta' is invalid: expected axis or key")
    with pytest.raises(ConfigError, match="comparison.matched.at.*frontier_key"):
        ComparisonConfig(**{**base, "frontier_key": ""}, matched=MatchedConfig(at=[0.06]))
    with pytest.raises(ConfigError, match="comparison.matched.at.*at most 3"):
        ComparisonConfig(**{**base, "primary": ["ema", "none"]}, matched=MatchedConfig(at=[0.03, 0.06]))
    with pytest.raises(ConfigError, match="comparison.matched.axis"):
        MatchedConfig(axis="kl/ref", at=[0.06])
    with pytest.raises(ConfigError, match="comparison.matched.at"):
        MatchedConfig(axis="eval/retention", at=[1.5])
    assert not MatchedConfig().declared
