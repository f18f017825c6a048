"""The rule that says whether one replicate's curve can be read at a matched value (reading_rules.py), on
hand-made points: each reason, its precedence, a value on a run, and the per-arm counts over replicates."""

from refexp.report.statistics.frontier_points import Point
from refexp.report.statistics.reading_rules import REASONS, failure_counts, read_between, replicate_problem


def curve(*beta_x):
    """Points (β, final x) with accuracy 0; run None, as the design step builds them."""
    return [Point(None, b, x, 0.0) for b, x in beta_x]


OVEROPT_FIXED = curve((1.0, 0.03), (0.5, 0.087), (0.2, 0.956))
"""fixed's runs in one over-optimisation replicate: β 0.5 -> 0.2 passes the β rule and spans kl/init 11x."""


def test_reasons_are_the_four_codes():
    assert set(REASONS) == {"outside", "axis_gap", "key_gap", "order"}


def test_outside_the_runs_range_is_never_extrapolated():
    assert replicate_problem(OVEROPT_FIXED, 0.02, True, 2.5, None) == "outside"
    assert replicate_problem(OVEROPT_FIXED, 1.5, True, 2.5, None) == "outside"
    assert replicate_problem(OVEROPT_FIXED, 1.5, True, 2.5, None, along="key") == "outside"
    assert replicate_problem([], 0.1, True, 2.5, None) == "outside"


def test_axis_gap_is_a_ratio_on_a_log_axis():
    assert replicate_problem(OVEROPT_FIXED, 0.3, True, 2.5, None) is None  # no axis rule: β 0.5 -> 0.2 passes
    assert replicate_problem(OVEROPT_FIXED, 0.3, True, 2.5, 2.0) == "axis_gap"  # 0.956 / 0.087 = 11 > 2
    assert replicate_problem(OVEROPT_FIXED, 0.3, True, 2.5, 10.9) == "axis_gap"
    assert replicate_problem(OVEROPT_FIXED, 0.3, True, 2.5, 11.0) is None
    assert replicate_problem(OVEROPT_FIXED, 0.05, True, 2.5, 2.8) == "axis_gap"  # 0.087 / 0.03 = 2.9
    assert replicate_problem(OVEROPT_FIXED, 0.05, True, 2.5, 3.0) is None


def test_axis_gap_is_a_difference_on_a_linear_axis():
    pts = curve((1.0, 0.9), (0.5, 0.8), (0.2, 0.5))
    assert replicate_problem(pts, 0.6, False, 2.5, 0.2) == "axis_gap"  # 0.8 - 0.5 = 0.3
    assert replicate_problem(pts, 0.6, False, 2.5, 0.3) is None
    assert replicate_problem(pts, 0.85, False, 2.5, 0.05) == "axis_gap"
    assert replicate_problem(pts, 0.85, False, 2.5, 0.1) is None


def test_key_gap_stays_a_second_guard():
    pts = curve((1.0, 0.03), (0.1, 0.05))  # β 10x apart, x 1.7x apart
    assert replicate_problem(pts, 0.04, True, 2.5, None) == "key_gap"
    assert replicate_problem(pts, 0.04, True, 2.5, 2.0) == "key_gap"
    assert replicate_problem(pts, 0.04, True, 10.0, 2.0) is None
    # both too wide: the axis rule is named, the one this item adds
    assert replicate_problem(curve((1.0, 0.03), (0.1, 0.3)), 0.1, True, 2.5, 2.0) == "axis_gap"


def test_a_value_on_a_run_is_read_there():
    assert replicate_problem(OVEROPT_FIXED, 0.087, True, 2.5, 2.0) is None
    assert replicate_problem(OVEROPT_FIXED, 0.956, True, 2.5, 2.0) is None
    assert replicate_problem(OVEROPT_FIXED, 0.03, True, 1.1, 1.1, along="key") is None
    assert [p.x for p in read_between(OVEROPT_FIXED, 0.087, True)] == [0.087]


def test_along_the_key_the_crossing_pair_is_judged_not_the_nearest_in_x():
    # drift not monotone in β: β 2 ends at more drift than β 1
    pts = curve((2.0, 0.5), (1.0, 0.1), (0.5, 0.2), (0.2, 0.4))
    # along the axis 0.45 lies between x 0.4 (β 0.2) and 0.5 (β 2): β 10x apart
    assert replicate_problem(pts, 0.45, True, 2.5, None) == "key_gap"
    # along the key the path β 0.2 -> 0.5 -> 1 -> 2 crosses 0.45 only between β 1 and 2 (x 0.1 -> 0.5)
    assert [p.value for p in read_between(pts, 0.45, True, along="key")] == [1.0, 2.0]
    assert replicate_problem(pts, 0.45, True, 2.5, None, along="key") is None
    assert replicate_problem(pts, 0.45, True, 2.5, 2.0, along="key") == "axis_gap"  # 0.5 / 0.1 = 5


def test_failure_counts_count_every_failing_replicate_by_reason_per_arm():
    seeds = [("", 0), ("", 1), ("", 2), ("", 3)]
    fixed = {seeds[0]: OVEROPT_FIXED, seeds[1]: OVEROPT_FIXED, seeds[2]: curve((1.0, 0.03), (0.5, 0.2)),
             seeds[3]: curve((1.0, 0.2), (0.5, 0.25), (0.2, 0.4))}
    ema = {s: curve((1.0, 0.1), (0.5, 0.2), (0.2, 0.35)) for s in seeds}
    ema[seeds[3]] = curve((1.0, 0.1), (0.1, 0.4))
    got = failure_counts({"fixed": fixed, "ema": ema}, seeds, 0.3, True, 2.5, 2.0)
    assert got == {"fixed": {"axis_gap": 2, "outside": 1}, "ema": {"axis_gap": 1}}
    assert failure_counts({"ema": ema}, seeds[:3], 0.3, True, 2.5, 2.0) == {"ema": {}}
    assert failure_counts({"fixed": {}}, seeds[:1], 0.3, True, 2.5, None) == {"fixed": {"outside": 1}}
