"""The declared crossing estimand (``comparison.matched.estimand: crossing``) on the synthetic sweep of
tests/helpers/crossing_sweeps.py: each run read where its drift first passes the declared value between two
evaluations after step 0 (hand-computed here), a replicate no run of an arm passes making no claim counted by
reason, a bad estimand refused in one line, and the design step's simulated reading equal to the report's on the
same curves (one rule: refexp/report/statistics/drift_crossing.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from refexp.config import ConfigError, MatchedConfig
from refexp.report import build_report
from refexp.report.power.crossing import crossing_reader, trajectories
from refexp.report.power.simulate import Draw
from refexp.report.reading.comparison_plan import block_problem, make_plan
from refexp.report.reading.load import load_sweep
from refexp.report.statistics.crossing_contrasts import run_curves
from refexp.report.statistics.trajectory_crossing import read_replicate, read_run
from tests.helpers.crossing_sweeps import EVERY, STEPS, crossing_block, crossing_sweep, write_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "analysis"))

F_EMA = math.log(0.2 / 0.15) / math.log(0.25 / 0.15)
"""Where ema's beta 1 run passes kl/init 0.2 between its evaluations at steps 20 (0.15) and 30 (0.25), in log."""


def _hand_difference(seed: int) -> float:
    """ema - fixed at kl/init 0.2 in one seed: fixed's beta 0.1 run is read halfway in log between steps 20 (0.1) and
    30 (0.4), solving 100 + seed and 140 + seed prompts there; ema's beta 1 run at F_EMA between 110 and 130 + 3 seed;
    the other run of each arm does not pass 0.2 and is left out of its mean."""
    fixed = 100 + seed + 0.5 * 40
    ema = 110 + F_EMA * (20 + 3 * seed)
    return (ema - fixed) / 200


def test_a_crossing_is_read_between_two_evaluations_in_log_drift(tmp_path):
    crossing_sweep(tmp_path, [0.2, 0.6])
    runs = load_sweep(tmp_path)
    fixed_01 = next(r for r in runs if r.name == "fixed-0.1-0")
    got, reached = read_run(fixed_01, "kl/init", "eval/accuracy", 0.2)
    assert reached and got.steps == (20, 30) and got.xs == (0.1, 0.4)
    assert got.value == pytest.approx(120 / 200) and np.mean(list(got.scores.values())) == pytest.approx(120 / 200)
    assert got.linear == pytest.approx((100 + 40 * (0.2 - 0.1) / 0.3) / 200)

    report = build_report(tmp_path)
    primary = report.frontier.primary
    assert primary.estimand == "crossing"
    row = primary.rows[0]
    assert (row.arm, row.x, row.result is not None) == ("ema", 0.2, True)
    assert row.result.point == pytest.approx(np.mean([_hand_difference(s) for s in (0, 1, 2)]))
    assert row.result.seeds.diffs == pytest.approx([_hand_difference(s) for s in (0, 1, 2)])
    assert primary.verdicts[row.label].family_size == 2  # the 0.6 contrast makes no claim and still counts
    assert "estimand **crossing**" in primary.text and "part-way through their runs" in primary.text
    assert "the drift resample re-reads curves of final points and is not applied to a crossing" in primary.text
    first = report.markdown_path.read_text().split("\n## ", 2)[1]
    assert "| ema − fixed | eval/accuracy where each run's kl/init first passes 0.2 (crossing) | +0.010 |" in first
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["frontier"]["primary"]["estimand"] == "crossing"


def test_a_replicate_no_run_of_an_arm_passes_makes_no_claim_counted_by_reason(tmp_path):
    """At kl/init 0.6 ema's beta 0.1 run starts past it in seeds 0 and 1 (0.7 at step 10) and never reaches it in
    seed 2 (0.45 at the most), its beta 1 run never reaches it; at 0.9 fixed never reaches it either."""
    crossing_sweep(tmp_path, [0.6, 0.9])
    rows = build_report(tmp_path).frontier.primary.rows
    assert [r.result for r in rows] == [None, None]
    assert rows[0].no_claim == (
        "not read at kl/init 0.6: 3 of 3 replicates fail (ema in 1 (no run's drift reached it) and 2 (every run that "
        "reached it had passed it by its first evaluation after step 0)); e.g. ema's runs in seed 0 that reached it "
        "were at kl/init 0.7 or more by their first evaluation after step 0 (step 10); a crossing is never "
        "extrapolated")
    assert rows[1].no_claim == (
        "not read at kl/init 0.9: 3 of 3 replicates fail (the baseline in 3 (no run's drift reached it), ema in 1 (no "
        "run's drift reached it)); e.g. the baseline's runs in seed 0 reached kl/init 0.8 at the most; a crossing is "
        "never extrapolated")


_CLI = "import sys\nfrom refexp.__main__ import main\nsys.argv = ['refexp', *sys.argv[1:]]\nmain()\n"


def test_a_bad_estimand_is_refused_in_one_line(tmp_path):
    assert MatchedConfig(at=[0.06], estimand="crossing").estimand == "crossing"
    assert MatchedConfig(at=[0.06]).estimand == "frontier"
    with pytest.raises(ConfigError) as bad:
        MatchedConfig(at=[0.06], estimand="final")
    assert str(bad.value) == "comparison.matched.estimand='final' is invalid: expected frontier or crossing"
    with pytest.raises(ConfigError, match=r"comparison\.matched\.estimand='crossing' is invalid: expected frontier "
                                          r"on eval/retention"):
        MatchedConfig(axis="eval/retention", at=[0.5], estimand="crossing")
    block = crossing_block([0.2])
    assert block_problem(block) is None
    assert block_problem({**block, "matched": {"at": [0.2], "estimand": "last"}}) == (
        "comparison.matched.estimand='last' is invalid: expected frontier or crossing")
    out = subprocess.run([sys.executable, "-c", _CLI, "experiment=frontier_test", "comparison.matched.estimand=final",
                          "logger=none", f"hydra.run.dir={tmp_path}"], capture_output=True, text=True, timeout=120)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0] == "refexp: error: comparison.matched.estimand='final' is invalid: expected frontier or crossing"
    assert not list(tmp_path.iterdir())


class _Fit:
    """An arm's fitted metric against log drift, bent (a cubic), so a chord between two evaluations is not the
    curve at the value."""

    log = True

    @staticmethod
    def metric(t):
        return 0.5 + 0.1 * t - 0.08 * t ** 2 - 0.02 * t ** 3


FINALS = {"fixed": [[0.8, 0.05], [0.5, 0.3], [0.15, 0.12]], "ema": [[2.0, 0.4], [1.8, 0.6], [1.7, 1.0]]}
"""arm -> seed -> its runs' final kl/init at beta 0.1 and 1: at kl/init 0.2, growing as step^1.5, fixed's seed 0 run
at beta 0.1 passes it between steps 10 and 20, both of seed 1 pass it, none of seed 2 reaches it; ema's beta 0.1 runs
had passed it by step 10, its beta 1 runs pass it."""


def test_the_design_steps_crossing_reader_and_the_reports_agree_on_the_same_curves(tmp_path):
    """A simulated draw (one start, 3 seeds, beta 0.1 and 1) read by the design step, and the same runs written to disk
    (kl/init and accuracy at every evaluation as the draw's trajectories give them) read by the report: the same
    replicates fail for the same reason and the others get the same value; the exploratory script reads each run
    the same."""
    import trajectory_matched

    exponent, at, rng = 1.5, 0.2, np.random.default_rng(0)
    values, why, decl = {}, {}, crossing_block([at])
    for arm, finals in FINALS.items():
        x = np.array(finals, dtype=float)[None, None]  # [n 1, S 1, K 3, G 2]
        effect = rng.normal(0, 0.02, x.shape)
        fit = _Fit()
        draw = Draw(fit, np.array([0.1, 1.0]), x, np.log(x), fit.metric(np.log(x)) + effect, effect)
        w, v = crossing_reader({arm: fit}, STEPS, EVERY, exponent, True)(draw, 0, at)
        why[arm], values[arm] = w, v[0]
        t = trajectories(np.log(x[0, 0]), STEPS, EVERY, exponent)  # [K, G, E]
        for seed in range(3):
            for g, beta in enumerate((0.1, 1.0)):
                write_run(tmp_path, arm, beta, seed, drift=np.exp(t[seed, g]).tolist(), decl=decl,
                          accuracy=(_Fit.metric(t[seed, g]) + effect[0, 0, seed, g]).tolist())
    assert why == {"fixed": [None, None, "never_reached"], "ema": [None, None, None]}
    runs = load_sweep(tmp_path)
    curves = run_curves(runs, make_plan(runs), "kl/init", "eval/accuracy")
    for arm in FINALS:
        for seed in range(3):
            read = read_replicate(curves[arm][("", seed)], "kl/init", "eval/accuracy", at)
            assert read.reason == why[arm][seed]
            if read.reason is None:
                assert read.value == pytest.approx(values[arm][seed], rel=1e-12, abs=1e-12)
                for c in read.crossings:
                    series = [(float(x), float(y)) for x, y in zip(c.run.series("kl/init")[1][1:],
                                                                   c.run.series("eval/accuracy")[1][1:])]
                    assert trajectory_matched.crossing(series, at) == pytest.approx(c.value, rel=1e-12)
            else:
                assert math.isnan(values[arm][seed])
