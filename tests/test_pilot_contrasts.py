"""The design step's paired readings (refexp/report/power/pilot_contrasts.py): each pilot replicate's arm − baseline
difference read by the report's rule, its start and seed variances by nested moments against a hand computation,
each variance's 80% upper bound, and the power a design gets from them."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import chi2

from refexp.report.power.detectable import power_at
from refexp.report.power.pilot_contrasts import paired_power, paired_readings, upper_bound
from refexp.report.power.pilot_runs import PilotRun, PilotRuns
from refexp.report.power.simulate import Rules

RULES = Rules(log=True, key_gap=2.5, max_gap=None, along="axis")
DIFFS = {("s0", 0): 0.10, ("s0", 1): 0.04, ("s1", 0): -0.02, ("s1", 1): 0.02, ("s2", 0): 0.07, ("s2", 1): 0.03}


def _runs(diffs: dict) -> PilotRuns:
    """Per replicate, the baseline at beta 1 and 2 (drift 0.2, 0.05: accuracy 0.9, 0.6) and the arm at beta 5 and 10
    on the same drifts, its accuracy shifted by the replicate's difference: read at drift 0.1 (halfway in log)."""
    runs = []
    for (start, seed), d in diffs.items():
        runs += [PilotRun("fixed", start, seed, 1.0, 0.2, 0.9, None),
                 PilotRun("fixed", start, seed, 2.0, 0.05, 0.6, None),
                 PilotRun("ema", start, seed, 5.0, 0.2, 0.9 + d, None),
                 PilotRun("ema", start, seed, 10.0, 0.05, 0.6 + d, None)]
    return PilotRuns("synthetic", runs)


def test_the_differences_and_their_variances_are_the_hand_computed_ones():
    p = paired_readings(_runs(DIFFS), "fixed", "ema", 0.1, RULES)
    assert p.unreadable == 0
    assert {s: np.round(ds, 12).tolist() for s, ds in p.by_start.items()} == {
        "s0": [0.10, 0.04], "s1": [-0.02, 0.02], "s2": [0.07, 0.03]}
    # seeds: within-start squared deviations (0.03² × 2 + 0.02² × 2 + 0.02² × 2) over 3 df; start means 0.07, 0, 0.05
    v_seed = (2 * 0.03**2 + 2 * 0.02**2 + 2 * 0.02**2) / 3
    v_means = np.var([0.07, 0.0, 0.05], ddof=1)
    start, seed = p.components(upper=False)
    assert seed == pytest.approx(v_seed) and start == pytest.approx(v_means - v_seed / 2)
    start_u, seed_u = p.components(upper=True)
    assert seed_u == pytest.approx(3 * v_seed / chi2.ppf(0.2, 3))
    assert start_u == pytest.approx(2 * v_means / chi2.ppf(0.2, 2) - v_seed / 2)
    se, power, _ = paired_power(p, 6, 4, 0.05, 0.025)
    assert se == pytest.approx(math.sqrt(start_u / 6 + seed_u / 24))
    assert power == pytest.approx(power_at(0.05, se, 5, 0.025))


def test_start_means_closer_than_their_seeds_allow_count_as_the_seeds_share():
    """Two starts whose means agree by luck: the means' variance is taken as at least v_seed / K_p, so the start
    variance is 0 at the point estimate and its bound is the seeds' share's bound, never 0."""
    lucky = {("s0", 0): 0.10, ("s0", 1): 0.00, ("s1", 0): 0.00, ("s1", 1): 0.10}
    p = paired_readings(_runs(lucky), "fixed", "ema", 0.1, RULES)
    v_seed = 4 * 0.05**2 / 2
    assert p.components(upper=False) == pytest.approx((0.0, v_seed))
    assert p.components(upper=True)[0] == pytest.approx(v_seed / 2 / chi2.ppf(0.2, 1) - v_seed / 2)


def test_a_replicate_the_report_cannot_read_is_counted_and_left_out():
    p = paired_readings(_runs(DIFFS), "fixed", "ema", 0.5, RULES)  # above every run's drift
    assert p.unreadable == 6 and p.differences == [] and p.components(upper=True) is None
    assert math.isnan(paired_power(p, 6, 4, 0.05, 0.025)[1])


def test_upper_bound_is_the_chi_square_one():
    assert upper_bound(1.0, 1) == pytest.approx(1 / chi2.ppf(0.2, 1))
    assert upper_bound(2.0, 10) == pytest.approx(20 / chi2.ppf(0.2, 10))


def test_a_one_start_design_reads_the_seeds_alone():
    one = {("s0", k): d for k, d in enumerate([0.10, 0.04, 0.06, 0.02])}
    p = paired_readings(_runs(one), "fixed", "ema", 0.1, RULES)
    start, seed = p.components(upper=True)
    assert math.isnan(start) and seed == pytest.approx(3 * np.var([0.10, 0.04, 0.06, 0.02], ddof=1) / chi2.ppf(0.2, 3))
    assert p.se(1, 6, upper=True) == pytest.approx(math.sqrt(seed / 6))
    assert math.isnan(p.se(6, 4, upper=True))  # a design over starts needs the starts' variance
