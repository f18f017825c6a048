"""refexp/report/power/detectable.py against R's power.t.test (its documented examples) and a hand computation."""

from __future__ import annotations

import math

import pytest
from scipy.stats import norm

from refexp.report.power.detectable import (
    Components,
    Design,
    degrees_of_freedom,
    design_detectable_difference,
    detectable_difference,
    power_at,
    standard_error,
)


def test_power_matches_r_power_t_test():
    # power.t.test(n = 20, delta = 1): two samples, sd 1 -> power 0.8689528 (se = sqrt(2/20), 38 df)
    assert power_at(1.0, math.sqrt(2 / 20), 38, 0.05) == pytest.approx(0.8689528, abs=1e-6)
    # power.t.test(power = .90, delta = 1) -> n = 22.02110: at that n, delta 1 is the detectable difference
    n = 22.02110
    assert detectable_difference(math.sqrt(2 / n), 2 * (n - 1), 0.05, 0.9) == pytest.approx(1.0, abs=1e-5)


def test_the_detectable_difference_tends_to_the_normal_formula_and_is_infinite_without_a_test():
    z = norm.ppf(0.975) + norm.ppf(0.8)  # 1.95996 + 0.84162 = 2.80158
    assert detectable_difference(0.01, 10**7, 0.05) == pytest.approx(z * 0.01, rel=1e-4)
    assert detectable_difference(0.01, 2, 0.05) > detectable_difference(0.01, 20, 0.05) > z * 0.01
    assert detectable_difference(0.01, 0, 0.05) == math.inf


def test_the_design_standard_error_is_the_sum_of_its_components_by_hand():
    c = Components(start=0.004, seed=0.002, prompt=0.1, residual=0.3)
    d = Design(starts=2, seeds=3, prompts=200, alpha=0.05, family=2)
    by_hand = math.sqrt(0.004 / 2 + 0.002 / 6 + 0.1 / 200 + 0.3 / 1200)  # = sqrt(0.0030833...)
    assert standard_error(c, d) == pytest.approx(by_hand)
    assert degrees_of_freedom(d) == 1 and degrees_of_freedom(Design(1, 3, 200, 0.05, 1)) == 2
    mdd, se, df = design_detectable_difference(c, d)
    assert se == pytest.approx(by_hand) and df == 1
    assert power_at(mdd, se, 1, 0.025) == pytest.approx(0.8, abs=1e-9)  # alpha / family: Holm's first step
    assert standard_error(Components(0.004, 0.002, 0.1, None), d) < by_hand  # no residual: the seed term holds it
