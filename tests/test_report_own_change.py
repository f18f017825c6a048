"""What each group kept: a run's final eval/retention against its own step-0 evaluation, paired by prompt, over
seeds (and SFT starts), Holm over the groups: a group that forgets falls, one that keeps is inconclusive."""

from __future__ import annotations

import pytest

from refexp.report import build_report
from refexp.report.statistics.paired import START_LEVEL
from tests.helpers.frontier_sweeps import block, write_run


def _forgetting_sweep(root, starts=(None,)):
    """ema forgets 40 + seed (+ 2 per start) of its 180 retention prompts solved at the start; fixed moves by
    -1, 0, +1 prompts by seed."""
    decl = block(["fixed", "ema"])
    for start in starts:
        extra = () if start is None else (f"sft.seed={start}",)
        for seed in (0, 1, 2):
            write_run(root, "ema", 0.04, seed, solved=120, kl=1.0, decl=decl,
                      retained=(180, 140 - seed - 2 * (start or 0)), overrides=extra)
            write_run(root, "fixed", 0.04, seed, solved=100, kl=0.1, decl=decl, retained=(180, 179 + seed),
                      overrides=extra)


def test_a_group_that_forgets_falls_and_one_that_keeps_is_inconclusive(tmp_path):
    _forgetting_sweep(tmp_path)
    report = build_report(tmp_path)
    changes = report.own_changes["grpo"]
    rows = {r.label: r for r in changes.rows}
    ema, fixed = changes.verdicts["ema"], changes.verdicts["fixed"]
    # per seed: ema (140 - seed - 180) / 200 = -0.200, -0.205, -0.210; fixed -0.005, 0, +0.005
    assert ema.result.seeds.diffs == pytest.approx((-0.2, -0.205, -0.21))
    assert ema.result.point == pytest.approx(-0.205) and ema.word == "lower"
    assert fixed.result.point == pytest.approx(0.0, abs=1e-12) and fixed.word == "inconclusive"
    assert fixed.interval[0] < 0 < fixed.interval[1] and ema.interval[1] < 0
    assert ema.family_size == 2 and rows["ema"].units == [("", 0), ("", 1), ("", 2)]
    md = report.markdown_path.read_text()
    assert "**What each group kept.**" in md and "| ema | 3 | -0.205 [" in md and "] fell |" in md
    summary = report.summary_path.read_text()
    assert '"kept"' in summary and '"verdict": "lower"' in summary


def test_several_sft_starts_are_the_units_of_the_change(tmp_path):
    """Two starts x three seeds: the t is over the two per-start mean changes, the bootstrap resamples starts,
    then seeds, then prompts."""
    _forgetting_sweep(tmp_path, starts=(0, 1))
    report = build_report(tmp_path)
    changes = report.own_changes["grpo"]
    ema = changes.verdicts["ema"]
    # start 0: -0.200, -0.205, -0.210 (mean -0.205); start 1: each 2 prompts (0.010) lower (mean -0.215)
    assert ema.result.seeds.unit == START_LEVEL
    assert ema.result.seeds.diffs == pytest.approx((-0.205, -0.215))
    assert ema.result.levels == (START_LEVEL, "seed", "prompt") and ema.result.point == pytest.approx(-0.21)
    # within each start, conditional on it: its three seeds, then prompts
    assert list(changes.within) == ["sft.seed=0", "sft.seed=1"]
    inside = changes.within["sft.seed=1"].verdicts["ema"]
    assert inside.result.seeds.unit == "seed" and inside.result.seeds.diffs == pytest.approx((-0.21, -0.215, -0.22))
    assert "within SFT start sft.seed=1" in report.markdown_path.read_text()


def test_no_table_without_retention_outcomes(tmp_path):
    decl = block(["fixed", "ema"])
    for seed in (0, 1):
        for arm in ("fixed", "ema"):
            write_run(tmp_path, arm, 1.0, seed, solved=100, kl=0.1, decl=decl)
    report = build_report(tmp_path)
    assert report.own_changes == {} and "**What each group kept.**" not in report.markdown_path.read_text()
