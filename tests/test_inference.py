"""The paired hierarchical bootstrap, Holm's adjustment, equivalence tests and the verdict words
(refexp/report/statistics/bootstrap.py, refexp/report/statistics/inference.py), on synthetic per-prompt outcomes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm, t

from refexp.report.statistics import paired
from refexp.report.statistics.bootstrap import BootstrapResult, paired_hierarchical_bootstrap
from refexp.report.statistics.inference import (
    equivalence,
    family_verdicts,
    holm,
    minimum_detectable_difference,
    verdict_word,
)
from refexp.report.statistics.paired import START_LEVEL, SeedOnlyResult, unit_result
from refexp.report.statistics.stats import mean_ci

FORBIDDEN = ("stops", "the same", "equal", "does not order")


def _seed_runs(wins: int, losses: int, ties_right: int, n_prompts: int, offset: int):
    """(arm, baseline) 0/1 outcomes over ``n_prompts`` prompts: the arm alone right on ``wins`` prompts, the
    baseline alone on ``losses``, both on ``ties_right``; the rest both wrong. ``offset`` rotates which
    prompts, so seeds disagree on different prompts."""
    arm, base = np.zeros(n_prompts), np.zeros(n_prompts)
    k = 0
    for n, a, b in ((wins, 1, 0), (losses, 0, 1), (ties_right, 1, 1)):
        for _ in range(n):
            i = (k + offset) % n_prompts
            arm[i], base[i] = a, b
            k += 1
    return arm, base


def _normal_result(point: float, se: float, n_boot: int = 20000) -> BootstrapResult:
    """A bootstrap distribution shaped exactly like N(point, se²): its quantiles at (i + 0.5) / B."""
    reps = point + se * norm.ppf((np.arange(n_boot) + 0.5) / n_boot)
    return BootstrapResult.from_replicates(reps, point, alpha=0.05, levels=("seed", "prompt"),
                                           n_units=(5, 1000), resampled=("seed", "prompt"))


# ------------------------------------------------------------------ (a) prompts widen the interval
def test_seed_only_interval_excludes_0_but_the_prompt_level_one_does_not_and_the_verdict_says_so():
    # 3 seeds, 20 prompts each: the arm wins 4-5 prompts and loses 2 on each seed, so the seed means
    # (+0.10, +0.10, +0.15) happen to agree, while 6-7 disagreeing prompts out of 20 are a noisy sample.
    runs = {0: _seed_runs(4, 2, 6, 20, 0), 1: _seed_runs(4, 2, 6, 20, 7), 2: _seed_runs(5, 2, 6, 20, 13)}
    per_seed = [a.mean() - b.mean() for a, b in runs.values()]
    assert per_seed == pytest.approx([0.10, 0.10, 0.15])
    seed_only = mean_ci(per_seed)
    assert seed_only.mean - seed_only.half_width > 0  # the seed-only t interval excludes 0

    result = paired_hierarchical_bootstrap(runs, n_boot=4000, seed=1)
    assert result.point == pytest.approx(np.mean(per_seed))
    assert result.interval[0] < 0 < result.interval[1]
    assert result.p_value > 0.05
    (v,) = family_verdicts({"ema": result}, alpha=0.05).values()
    assert v.word == "inconclusive"
    assert "(family of 1 comparison against fixed, alpha 0.05): inconclusive." in v.sentence("fixed")
    assert v.phrase == f"inconclusive (interval [{v.interval[0]:+.3f}, {v.interval[1]:+.3f}])"


# ------------------------------------------------------------------ (b) Holm
def test_holm_matches_the_hand_computed_step_down():
    # sorted 0.01, 0.03, 0.04 -> 3*0.01 = 0.03, max(0.03, 2*0.03) = 0.06, max(0.06, 1*0.04) = 0.06
    h = holm([0.04, 0.01, 0.03], alpha=0.05)
    np.testing.assert_allclose(h.adjusted, [0.06, 0.03, 0.06])
    assert h.reject.tolist() == [False, True, False]
    # the DPO family: 0.016 against 0.05/4 = 0.0125 first, so nothing is rejected
    h = holm([0.016, 0.2, 0.5, 0.03], alpha=0.05)
    np.testing.assert_allclose(h.adjusted, [0.064, 0.4, 0.5, 0.09])
    assert not h.reject.any()
    np.testing.assert_allclose(holm([0.3, 0.6], 0.05).adjusted, [0.6, 0.6])  # monotone, capped at 1 below
    assert holm([0.7, 0.9], 0.05).adjusted.max() == 1.0
    with pytest.raises(ValueError):
        holm([0.2, 1.5])


def test_holm_changes_verdicts_that_unadjusted_tests_would_call_separated():
    # raw two-sided p of 0.01, 0.03, 0.04 (z = 2.576, 2.170, 2.054 with se 0.05)
    results = {name: _normal_result(norm.ppf(1 - p / 2) * 0.05, 0.05)
               for name, p in (("ema", 0.01), ("reset", 0.03), ("none", 0.04))}
    for name, p in (("ema", 0.01), ("reset", 0.03), ("none", 0.04)):
        assert results[name].p_value == pytest.approx(p, abs=2e-4)
        alone = family_verdicts({name: results[name]}, alpha=0.05)[name]
        assert alone.word == "higher"  # a family of one: the unadjusted test
    family = family_verdicts(results, alpha=0.05)
    assert {k: v.word for k, v in family.items()} == {"ema": "higher", "reset": "inconclusive",
                                                       "none": "inconclusive"}
    assert family["reset"].p_holm == pytest.approx(0.06, abs=5e-4)
    text = family["reset"].sentence("fixed")
    assert "family of 3 comparisons against fixed" in text and "simultaneous (Bonferroni) 98.33% interval" in text
    assert "Holm-adjusted p 0.06" in text


def test_holm_decides_and_the_verdict_says_where_the_simultaneous_interval_still_covers_0():
    assert verdict_word(0.1, 0.04, 0.05) == "higher" and verdict_word(-0.1, 0.04, 0.05) == "lower"
    assert verdict_word(0.1, 0.06, 0.05) == "inconclusive"
    assert verdict_word(0.1, 0.001, 0.05, degenerate=True) == "degenerate t"  # whatever the p
    # raw p 0.001, 0.002, 0.04: Holm rejects all three (0.003, 0.004, 0.04); the third's 98.33% interval, which
    # excludes 0 only below p 0.05/3, covers 0
    results = {name: _normal_result(norm.ppf(1 - p / 2) * 0.05, 0.05)
               for name, p in (("ema", 0.001), ("reset", 0.002), ("none", 0.04))}
    family = family_verdicts(results, alpha=0.05)
    assert [v.word for v in family.values()] == ["higher"] * 3
    assert [v.interval_covers_zero for v in family.values()] == [False, False, True]
    none = family["none"]
    assert none.interval[0] < 0 < none.interval[1] and none.p_holm == pytest.approx(0.04, abs=5e-4)
    assert none.phrase == "higher (Holm; the simultaneous interval covers 0)"
    assert "higher than fixed by Holm's step-down, which decides; the simultaneous interval" in none.sentence("fixed")
    assert family["ema"].phrase == "higher"


# ------------------------------------------------------------------ (c) coverage
def _coverage(n_seeds: int, n_prompts: int, seed_sd: float, sims: int) -> float:
    """Share of ``sims`` simulated sweeps whose 95% interval covers the true difference 0.1: per seed the
    arm's accuracy is 0.6 + N(0, seed_sd), the baseline's 0.5, each prompt a Bernoulli outcome."""
    rng = np.random.default_rng(2024)
    truth, covered = 0.1, 0
    for sim in range(sims):
        runs = {s: (rng.random(n_prompts) < 0.5 + truth + rng.normal(0.0, seed_sd), rng.random(n_prompts) < 0.5)
                for s in range(n_seeds)}
        r = paired_hierarchical_bootstrap(runs, n_boot=1000, seed=sim)
        covered += r.interval[0] <= truth <= r.interval[1]
    return covered / sims


def test_the_95_percent_interval_covers_a_known_difference_about_95_percent_of_the_time():
    assert 0.88 <= _coverage(n_seeds=8, n_prompts=100, seed_sd=0.1, sims=200) <= 0.99


def test_where_prompt_noise_dominates_the_interval_errs_wide():
    # Resampling prompts within each seed counts their noise twice (it is already in the spread of the
    # seed means), so with little seed-to-seed spread the interval is conservative, never too narrow.
    assert _coverage(n_seeds=8, n_prompts=40, seed_sd=0.0, sims=100) >= 0.97


def _shared_prompt_sweeps(delta: float, sims: int, n_seeds: int = 3, n_prompts: int = 200, seed: int = 7):
    """``sims`` simulated sweeps of THIS design: every run scored greedily on one sample of ``n_prompts`` test
    prompts, shared by its ``n_seeds`` seeds. A prompt is arm-favoured (the arm right with probability 0.9, the
    baseline 0.1), baseline-favoured (the reverse) or neutral (both 0.95 or both 0.05), so its prompt x arm effect
    is common to the seeds; a fresh prompt sample per sweep. P(arm-favoured) - P(baseline-favoured) = delta / 0.8,
    so the true difference (over the task's prompts and the seeds) is ``delta``. Returns arm, baseline [sims,
    seeds, prompts] 0/1."""
    rng = np.random.default_rng(seed)
    u = rng.random((sims, 1, n_prompts))
    kind = np.where(u < 0.3 + delta / 1.6, 1, np.where(u < 0.6, -1, 0))
    neutral = np.where(rng.random((sims, 1, n_prompts)) < 0.5, 0.95, 0.05)
    p_arm = np.where(kind == 1, 0.9, np.where(kind == -1, 0.1, neutral))
    p_base = np.where(kind == 1, 0.1, np.where(kind == -1, 0.9, neutral))
    shape = (sims, n_seeds, n_prompts)
    return (rng.random(shape) < p_arm).astype(float), (rng.random(shape) < p_base).astype(float)


@pytest.mark.parametrize("delta", [0.0, 0.08])
def test_the_reports_interval_covers_at_its_level_when_every_seed_is_scored_on_the_same_prompts(delta, monkeypatch):
    """The report's paired interval (``unit_result``: the bootstrap with its Student-t companion) over 3 seeds
    scored on one shared prompt sample covers the true difference at >= 95% less 3 simulation standard errors.
    Drawing prompts afresh within each seed (prompts nested in seeds) covers ~85% here: the prompt x arm effect
    common to the seeds is averaged as if each seed had its own prompts."""
    monkeypatch.setattr(paired, "N_BOOT", 1000)  # enough for a 95% percentile interval; keeps the test fast
    sims = 400
    arm, base = _shared_prompt_sweeps(delta, sims)
    ids = list(range(arm.shape[2]))[::-1]  # the runs' own prompt order; the report pairs by prompt id
    covered = 0
    for sim in range(sims):
        units = {("s0", s): ((arm[sim, s], base[sim, s], ids), float(arm[sim, s].mean() - base[sim, s].mean()))
                 for s in range(arm.shape[1])}
        result = unit_result(units)[0]
        lo, hi = result.percentile_interval(0.05)
        covered += lo <= delta <= hi
    assert covered / sims >= 0.95 - 3 * math.sqrt(0.95 * 0.05 / sims)


def test_units_share_one_prompt_draw_only_when_they_were_scored_on_the_same_prompts():
    rng = np.random.default_rng(8)
    scores = [(rng.random(6) < 0.5, rng.random(6) < 0.5) for _ in range(3)]
    same = {("s0", k): ((a, b, [5, 4, 3, 2, 1, 0] if k else list(range(6))), 0.1 * k)
            for k, (a, b) in enumerate(scores)}
    assert unit_result(same)[0].boot.shared_prompts  # the same ids, in any order
    other = {**same, ("s0", 2): ((*scores[2], [0, 1, 2, 3, 4, 9]), 0.2)}
    result = unit_result(other)[0]
    assert not result.boot.shared_prompts and "one prompt draw" not in result.method


# ------------------------------------------------------------------ (d) degenerate data
def test_all_equal_outcomes_give_a_collapsed_interval_p_1_and_no_nan():
    runs = {s: (np.ones(20), np.ones(20)) for s in range(3)}
    r = paired_hierarchical_bootstrap(runs, n_boot=500)
    assert (r.point, r.interval, r.p_value, r.se) == (0.0, (0.0, 0.0), 1.0, 0.0)
    (v,) = family_verdicts({"a": r}, margin=0.05).values()
    assert v.word == "equivalent within ±0.05" and v.mdd == 0.0
    assert all(math.isfinite(x) for x in (v.p_holm, *v.interval, v.mdd))
    (v,) = family_verdicts({"a": r}).values()
    assert v.word == "inconclusive"


def test_an_arm_right_on_every_prompt_the_baseline_misses_is_higher_with_the_smallest_p():
    r = paired_hierarchical_bootstrap({s: (np.ones(10), np.zeros(10)) for s in range(3)}, n_boot=999)
    assert (r.point, r.interval, r.se) == (1.0, (1.0, 1.0), 0.0)
    assert r.p_value == pytest.approx(2 / 1000)
    assert family_verdicts({"a": r})["a"].word == "higher"


def test_one_seed_resamples_prompts_only_and_says_so():
    rng = np.random.default_rng(0)
    r = paired_hierarchical_bootstrap({7: (rng.random(50) < 0.6, rng.random(50) < 0.5)}, n_boot=500)
    assert r.resampled == ("prompt",) and r.n_units == (1, 50)
    assert r.method == "paired percentile bootstrap over prompts; B=500"
    assert "one seed only" in r.note and r.se > 0 and r.interval[0] < r.point < r.interval[1]
    assert "Note: one seed only" in family_verdicts({"a": r})["a"].sentence("fixed")
    one = paired_hierarchical_bootstrap({0: ([1.0], [0.0])}, n_boot=50)
    assert one.resampled == () and one.interval == (1.0, 1.0) and "nothing" in one.method


def test_malformed_input_is_refused():
    with pytest.raises(ValueError, match="same prompts"):
        paired_hierarchical_bootstrap({0: (np.ones(3), np.ones(4))})
    with pytest.raises(ValueError, match="NaN"):
        paired_hierarchical_bootstrap({0: (np.array([1.0, np.nan]), np.ones(2))})
    with pytest.raises(ValueError, match="mapping"):
        paired_hierarchical_bootstrap({0: (np.ones(3), np.ones(3))}, levels=("start", "seed", "prompt"))
    with pytest.raises(ValueError, match="shared_prompts"):
        paired_hierarchical_bootstrap({0: ([1.0], [0.0]), 1: ([1.0, 1.0], [0.0, 0.0])}, shared_prompts=True)


# ------------------------------------------------------------------ (e) equivalence
def test_tost_claims_equivalence_within_a_wide_margin_and_not_within_a_narrow_one():
    rng = np.random.default_rng(5)
    runs = {s: (rng.random(200) < 0.5, rng.random(200) < 0.5) for s in range(5)}
    r = paired_hierarchical_bootstrap(runs, n_boot=2000)
    wide, narrow = equivalence(r, 0.2, 0.05), equivalence(r, 0.01, 0.05)
    assert wide.equivalent and wide.p_value < 0.05 and -0.2 < wide.interval[0] < wide.interval[1] < 0.2
    assert not narrow.equivalent and narrow.p_value > 0.05
    assert family_verdicts({"a": r}, margin=0.2)["a"].word == "equivalent within ±0.2"
    assert family_verdicts({"a": r}, margin=0.01)["a"].word == "inconclusive"


def _spread(center: float, half: float, n: int = 20001) -> BootstrapResult:
    """Replicates spread evenly over [center - half, center + half]: the (1 - 2a) percentile interval is exactly
    center ± (1 - 2a) half (90%: ± 0.9 half; 95%: ± 0.95 half)."""
    reps = center + half * np.linspace(-1.0, 1.0, n)
    return BootstrapResult.from_replicates(reps, center, alpha=0.05, levels=("seed", "prompt"), n_units=(5, 1000),
                                           resampled=("seed", "prompt"))


@pytest.mark.parametrize("margin, equivalent", [(0.0925, True), (0.0875, False)])
def test_tost_reads_the_90_percent_interval_at_alpha_005(margin, equivalent):
    """The 90% interval of a difference spread over ±0.1 is ±0.09, the 95% one ±0.095: a margin of 0.0925 holds the
    first and not the second, so TOST at alpha 0.05 (two one-sided 5% tests) claims equivalence, and 0.0875 holds
    neither."""
    tost = equivalence(_spread(0.0, 0.1), margin, 0.05)
    assert tost.interval == pytest.approx((-0.09, 0.09), abs=1e-9)
    assert tost.equivalent is equivalent and (tost.p_value <= 0.05) is equivalent
    verdict = family_verdicts({"a": _spread(0.0, 0.1)}, margin=margin)["a"]
    assert verdict.word == ("equivalent within ±" + f"{margin:g}" if equivalent else "inconclusive")
    assert "two one-sided tests at 0.05, 90% interval [-0.090, +0.090]" in verdict.sentence("fixed")


def test_tost_in_a_family_of_two_reads_the_95_percent_interval():
    """Two comparisons: each TOST at alpha/2 = 0.025, its (1 - 0.05) interval ±0.095; a margin of 0.0925 that one
    comparison alone would pass is now not enough."""
    results = {"a": _spread(0.0, 0.1), "b": _spread(0.0, 0.1)}
    assert family_verdicts(results, margin=0.0925)["a"].word == "inconclusive"
    assert family_verdicts(results, margin=0.0975)["a"].word == "equivalent within ±0.0975"


@pytest.mark.parametrize("center", [0.05, -0.05])
def test_tost_compares_the_margin_on_both_sides(center):
    """The 90% interval 0.05 ± 0.09 = [-0.04, +0.14] lies inside -0.1 on its lower side and past +0.1 on its upper
    side (the mirror for -0.05): equivalence needs both sides inside, so neither is equivalent within ±0.1; at ±0.15
    both are."""
    tost = equivalence(_spread(center, 0.1), 0.1, 0.05)
    assert sorted(abs(x) for x in tost.interval) == pytest.approx([0.04, 0.14])
    assert not tost.equivalent and tost.p_value > 0.05
    assert family_verdicts({"a": _spread(center, 0.1)}, margin=0.1)["a"].word == "inconclusive"
    assert equivalence(_spread(center, 0.1), 0.15, 0.05).equivalent


# ------------------------------------------------------------------ (f) determinism
def test_a_fixed_seed_gives_the_same_replicates_and_another_seed_does_not():
    rng = np.random.default_rng(3)
    runs = {s: (rng.random(30) < 0.6, rng.random(30) < 0.5) for s in range(4)}
    for shared in (False, True):
        a = paired_hierarchical_bootstrap(runs, n_boot=300, seed=11, shared_prompts=shared)
        b = paired_hierarchical_bootstrap(runs, n_boot=300, seed=11, shared_prompts=shared)
        c = paired_hierarchical_bootstrap(runs, n_boot=300, seed=12, shared_prompts=shared)
        np.testing.assert_array_equal(a.replicates, b.replicates)
        assert a == b and not np.array_equal(a.replicates, c.replicates)


# ------------------------------------------------------------------ levels and shared prompts
def test_three_nested_levels_resample_starts_then_seeds_then_prompts():
    rng = np.random.default_rng(4)
    tree = {start: {s: (rng.random(25) < 0.6, rng.random(25) < 0.5) for s in range(2 + i)}
            for i, start in enumerate(("sft-a", "sft-b"))}
    r = paired_hierarchical_bootstrap(tree, levels=("SFT start", "seed", "prompt"), n_boot=500)
    assert r.n_units == (2, 5, 125) and r.resampled == ("SFT start", "seed", "prompt")
    assert r.method == ("paired hierarchical percentile bootstrap: SFT starts, then seeds within SFT start, "
                        "then prompts within seed; B=500")
    per_start = [np.mean([a.mean() - b.mean() for a, b in seeds.values()]) for seeds in tree.values()]
    assert r.point == pytest.approx(np.mean(per_start))


def test_shared_prompt_draws_keep_a_prompt_effect_that_more_seeds_do_not_shrink():
    # every seed disagrees on the same prompts the same way: the prompts' noise is shared by the seeds
    rng = np.random.default_rng(6)
    effect = rng.choice([-1.0, 0.0, 1.0], size=100)
    runs = {s: (effect.copy(), np.zeros(100)) for s in range(9)}
    nested = paired_hierarchical_bootstrap(runs, n_boot=3000)
    shared = paired_hierarchical_bootstrap(runs, n_boot=3000, shared_prompts=True)
    prompt_se = effect.std() / math.sqrt(100)
    assert shared.se == pytest.approx(prompt_se, rel=0.1)
    assert nested.se == pytest.approx(prompt_se / 3, rel=0.1)  # nested: as if 9 x 100 independent prompts
    assert nested.method == "paired hierarchical percentile bootstrap: seeds, then prompts within seed; B=3000"
    assert shared.method == nested.method + "; one prompt draw per replicate for every run"


# ------------------------------------------------------------------ power and words
def test_minimum_detectable_difference_is_the_normal_approximation():
    assert minimum_detectable_difference(0.02, 0.05) == pytest.approx((1.959964 + 0.841621) * 0.02, rel=1e-5)
    assert minimum_detectable_difference(0.02, 0.05, power=0.9) > minimum_detectable_difference(0.02, 0.05)
    assert minimum_detectable_difference(0.0, 0.05) == 0.0


def test_sentences_state_family_adjustment_and_power_and_never_use_forbidden_words():
    results = {"up": _normal_result(0.2, 0.03), "down": _normal_result(-0.2, 0.03),
               "noise": _normal_result(0.02, 0.05), "flat": _normal_result(0.0, 0.01)}
    verdicts = family_verdicts(results, alpha=0.05, margin=0.05)
    assert {k: v.word for k, v in verdicts.items()} == {"up": "higher", "down": "lower",
                                                         "noise": "inconclusive",
                                                         "flat": "equivalent within ±0.05"}
    for v in verdicts.values():
        text = v.sentence("fixed")
        assert "family of 4 comparisons against fixed" in text and "Holm-adjusted p" in text
        assert "simultaneous (Bonferroni) 98.75% interval" in text and "80% power at alpha 0.0125" in text
        assert "With 5 seeds and 200 prompts" in text
        assert not any(word in text.lower() for word in FORBIDDEN), text


def test_the_detectable_difference_uses_students_t_when_a_t_test_must_reject():
    """Two SFT starts: the t over two start means has 1 df, and the difference it detects is many times the
    normal approximation's; a bootstrap alone keeps the normal one."""
    assert minimum_detectable_difference(0.02, 0.05, df=2) == pytest.approx((t.ppf(0.975, 2) + t.ppf(0.8, 2)) * 0.02)
    v = family_verdicts({"a": SeedOnlyResult((0.10, 0.12), unit=START_LEVEL)})["a"]
    assert v.df == 1 and v.mdd == pytest.approx((t.ppf(0.975, 1) + t.ppf(0.8, 1)) * v.result.se)
    assert v.mdd > 5 * minimum_detectable_difference(v.result.se, 0.05)
    assert "(Student t, 1 df)" in v.sentence("fixed")


# ------------------------------------------------------------------ a degenerate t, an uninformative interval
def test_a_degenerate_t_makes_no_claim_though_the_bootstrap_alone_would():
    """3 seeds whose accuracies differ by +0.060 each (on a 0.005 grid, as float differences of means): the t over
    them has no spread, so p 0 would let the bootstrap alone decide; the verdict says "degenerate t" instead and
    the comparison enters Holm with p 1, leaving the others' adjustment as if it rejected nothing."""
    runs = {s: _seed_runs(14, 2, 40 + 10 * s, 200, 17 * s) for s in range(3)}  # +12 of 200 net in every seed
    diffs = tuple(float(a.mean() - b.mean()) for a, b in runs.values())
    assert diffs == pytest.approx((0.06, 0.06, 0.06))
    units = {("s0", s): ((a, b, list(range(200))), d) for (s, (a, b)), d in zip(runs.items(), diffs)}
    result = unit_result(units)[0]
    assert result.degenerate and result.boot.p_value < 0.001 and result.p_value == 1.0
    other = _normal_result(0.1, 0.03)  # p ~ 0.001: rejected, adjusted as the smaller of 2
    family = family_verdicts({"flat": result, "up": other}, alpha=0.05, margin=0.5)
    v = family["flat"]
    assert v.word == "degenerate t" and v.p_text == "—"
    assert v.phrase == "degenerate t (3 identical per-seed differences): no claim"
    assert "no claim" in v.sentence("none") and "Holm-adjusted p" not in v.sentence("none")
    assert "Equivalence margin" not in v.sentence("none")  # margin 0.5 would hold on the collapsed t alone
    assert family["up"].word == "higher" and family["up"].p_holm == pytest.approx(2 * other.p_value)
    assert SeedOnlyResult((0.06, 0.06)).p_value == 1.0 and not SeedOnlyResult((0.06, 0.065)).degenerate


def test_an_interval_beyond_the_range_of_a_difference_of_proportions_prints_as_uninformative():
    """Two SFT starts, one run each: the t over 2 start means has 1 df, and a 97.5% interval of two start
    differences 0.05 apart reaches past ±1, which no difference of accuracies can take."""
    wide = family_verdicts({"a": SeedOnlyResult((0.10, -0.30), unit=START_LEVEL),
                            "b": SeedOnlyResult((0.10, 0.12), unit=START_LEVEL)}, bound=1.0)
    a, b = wide["a"], wide["b"]
    assert a.interval[0] < -1 and a.uninformative and a.word == "inconclusive"
    assert a.interval_text == "uninformative (1 df)" and a.phrase == "inconclusive (uninformative, 1 df)"
    assert "interval uninformative (1 df)" in a.sentence("fixed") and "[" not in a.sentence("fixed").split(":")[1]
    assert not b.uninformative and b.interval_text.startswith("[")
    assert not family_verdicts({"a": SeedOnlyResult((0.10, -0.30), unit=START_LEVEL)})["a"].uninformative


def test_the_equivalence_tests_interval_past_the_range_of_a_difference_of_proportions_prints_as_uninformative():
    """The two one-sided tests read a (1 - 2 alpha) interval of the same t: over 1 df it reaches past ±1 too, and
    the sentence says so rather than printing bounds no difference of accuracies can take."""
    a = family_verdicts({"a": SeedOnlyResult((0.10, -0.30), unit=START_LEVEL)}, bound=1.0, margin=0.05)["a"]
    assert a.equivalence.interval[0] < -1
    equivalence = a.sentence("fixed").split("Equivalence margin")[1]
    assert "interval uninformative (1 df) not inside the margin" in equivalence and "[" not in equivalence
    narrow = family_verdicts({"b": SeedOnlyResult((0.10, 0.12), unit=START_LEVEL)}, bound=1.0, margin=0.05)["b"]
    assert "% interval [" in narrow.sentence("fixed").split("Equivalence margin")[1]
