"""Several SFT starts as a factor of a sweep (``sft.seed=0,1 training.seed=0,1,2``): runs pair by (start, seed), the
bootstrap nests the seeds in the starts and its t companion is over the per-start means; one start is exactly the
one-start analysis. On synthetic sweeps written with the run record's writers."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml
from scipy.stats import t as t_dist

from refexp.components.wandb_conventions import run_info
from refexp.record import layout
from refexp.record.metrics import MetricsWriter
from refexp.record.outcomes import EvalOutcomes, append_outcomes
from refexp.record.resolved_config import write_resolved_config
from refexp.record.status import write_status
from refexp.report import build_report
from refexp.report.reading.group import group_runs
from refexp.report.reading.load import load_sweep
from refexp.report.reading.reduce import COLUMNS
from refexp.report.statistics.bootstrap import paired_hierarchical_bootstrap
from refexp.report.statistics.paired import N_BOOT, START_LEVEL, Endpoint, SeedOnlyResult, compare
from refexp.report.statistics.stats import mean_ci
from refexp.report.statistics.summary import endpoints
from refexp.report.writing.table import header_and_cells

STEPS, PROMPTS = 10, 200


def block(seeds) -> dict:
    return {"arm_key": "grpo_variant", "arms": ["fixed", "ema", "none"], "baseline": "fixed", "seeds": list(seeds),
            "metric": "eval/accuracy", "at_steps": [], "chosen_on_test": []}


def write_run(run_dir, arm: str, seed: int, final: np.ndarray, *, start: str | None, sft_seed: int = 0,
              seeds=(0, 1, 2), start_val: float = 0.5) -> None:
    """A completed GRPO run of ``arm`` from SFT start ``start`` (``status.json``'s ``sft_start`` key; None: a run
    that predates that record) whose final evaluation scored ``final`` [P] (step 0: every prompt 0)."""
    run_dir.mkdir(parents=True)
    (run_dir / layout.HYDRA_DIR).mkdir()
    (run_dir / layout.HYDRA_DIR / "overrides.yaml").write_text(
        yaml.safe_dump([f"grpo_variant={arm}", f"sft.seed={sft_seed}", f"training.seed={seed}"]))
    write_resolved_config(run_dir, {
        "algo": {"name": "grpo"}, "reference": {"name": arm}, "eval": {"num_prompts": PROMPTS},
        "sft": {"seed": sft_seed}, "training": {"seed": seed, "steps": STEPS, "num_threads": 1},
        "comparison": block(seeds)})
    log = MetricsWriter(run_dir)
    for step, scores in ((0, np.zeros(PROMPTS)), (STEPS, final)):
        log.write({"step": step, "eval/accuracy": float(scores.mean())})
        append_outcomes(run_dir, step, [EvalOutcomes("eval", "eval/accuracy", list(range(PROMPTS)),
                                                     scores.tolist())])
    log.close()
    status = {"status": "completed", "algo": "grpo", "reference": arm, "seed": seed, "steps": STEPS,
              "last_step": STEPS, "final": {"eval/accuracy": float(final.mean())}, "provenances": [{"commit": "abc"}]}
    if start is not None:
        status["sft_start"] = {"key": start, "val_accuracy": start_val, "eval_accuracy": start_val}
    write_status(run_dir, status)


def shifted(base: np.ndarray, net: int) -> np.ndarray:
    """``base`` [P] with ``net`` more prompts right (net > 0: the first wrong ones made right; < 0: the first right
    ones made wrong): a difference of exactly net / P, every prompt moving the same way."""
    out = base.copy()
    idx = np.flatnonzero(base == (0 if net > 0 else 1))[:abs(net)]
    out[idx] = 1.0 - out[idx]
    return out


def write_arm_pair(root, start, sft_seed, seed, net, rng, *, arms=("fixed", "ema"), seeds=(0, 1, 2), **kw):
    base = (rng.random(PROMPTS) < 0.5).astype(float)
    tag = start or f"s{sft_seed}"
    write_run(root / f"fixed-{tag}-{seed}", "fixed", seed, base, start=start, sft_seed=sft_seed, seeds=seeds, **kw)
    if "ema" in arms:
        write_run(root / f"ema-{tag}-{seed}", "ema", seed, shifted(base, net), start=start, sft_seed=sft_seed,
                  seeds=seeds, **kw)


def acc_endpoint() -> Endpoint:
    headline = next(c for c in COLUMNS if c.key == "acc_final")
    return endpoints(headline, ())[0]


def comparison(root, label: str = "ema"):
    groups = group_runs(load_sweep(root))["grpo"]
    base = next(g for g in groups if g.label == "fixed")
    group = next(g for g in groups if g.label == label)
    return compare(group, base, acc_endpoint(), lambda r: True)


# ---------------------------------------------------------------- one start: today's analysis, same numbers
def test_one_start_gives_exactly_the_one_start_analysis(tmp_path):
    """A one-start sweep: the comparison is the seeds-then-prompts bootstrap of ``{seed: (arm, baseline)}`` (one
    prompt draw per replicate for every run) with the same RNG, and the t over the per-seed differences, bit for bit;
    whether the start is recorded or not."""
    rng = np.random.default_rng(0)
    nets = (12, 3, 8)
    for seed, net in enumerate(nets):
        write_arm_pair(tmp_path / "recorded", "bef24490", 0, seed, net, rng)
    rng = np.random.default_rng(0)
    for seed, net in enumerate(nets):
        write_arm_pair(tmp_path / "old", None, 0, seed, net, rng)
    runs = {r.name: r for r in load_sweep(tmp_path / "recorded")}
    tree = {s: ([*runs[f"ema-bef24490-{s}"].outcomes[STEPS].values()],
                [*runs[f"fixed-bef24490-{s}"].outcomes[STEPS].values()]) for s in range(3)}
    # the one-start analysis, independently: every run scored the same prompts, so one prompt draw serves them all
    expected = paired_hierarchical_bootstrap(tree, n_boot=N_BOOT, shared_prompts=True)
    diffs = [n / PROMPTS for n in nets]
    for sweep in ("recorded", "old"):
        c = comparison(tmp_path / sweep)
        assert c.seeds == [0, 1, 2] and len(set(c.starts)) == 1
        assert c.result.levels == ("seed", "prompt") and c.result.n_units == (3, 3 * PROMPTS)
        np.testing.assert_array_equal(c.result.boot.replicates, expected.replicates)
        assert c.result.point == expected.point == pytest.approx(np.mean(diffs))
        assert c.result.seeds == SeedOnlyResult(tuple(pytest.approx(d) for d in diffs))
        assert c.seed_t.mean == pytest.approx(mean_ci(diffs).mean)
        assert c.seed_t.half_width == pytest.approx(mean_ci(diffs).half_width)
    text = build_report(tmp_path / "old").tables["grpo"].verdict
    assert "Runs paired by SFT start and seed: 1 SFT start × 3 seeds." in text
    assert "Student-t test over the per-seed differences" in text


# ---------------------------------------------------------------- several starts: nesting matters
def test_a_difference_consistent_within_starts_but_reversed_across_them_is_not_separated(tmp_path):
    """3 starts × 4 seeds: on starts A and B ema is above fixed by +0.10 on every seed, on start C below by -0.03.
    Pooled as 12 seeds of one start the seeds look steady (t over 12, df 11: [+0.016, +0.097]) and the verdict would
    be "higher"; as 3 starts the t over the start means (+0.10, +0.10, -0.03; df 2) spans 0, and so does the
    bootstrap over starts (all three draws from C: probability 1/27 per tail)."""
    rng = np.random.default_rng(1)
    nets = {"aaaa": 20, "bbbb": 20, "cccc": -6}
    for k, (start, net) in enumerate(nets.items()):
        for seed in range(4):
            write_arm_pair(tmp_path / "nested", start, k, seed, net, rng, seeds=range(4), start_val=0.5 + k / 100)
    rng = np.random.default_rng(1)
    for k, net in enumerate(nets.values()):  # the same runs as 12 seeds of one start
        for seed in range(4):
            write_arm_pair(tmp_path / "pooled", "one", 0, 4 * k + seed, net, rng, seeds=range(12))

    pooled = build_report(tmp_path / "pooled").tables["grpo"].verdicts["acc_final"]["ema"]
    assert pooled.word == "higher" and pooled.interval[0] > 0
    report = build_report(tmp_path / "nested")
    v = report.tables["grpo"].verdicts["acc_final"]["ema"]
    assert v.result.levels == (START_LEVEL, "seed", "prompt") and v.result.n_units == (3, 12, 12 * PROMPTS)
    assert v.result.point == pytest.approx((0.1 + 0.1 - 0.03) / 3) == pytest.approx(pooled.result.point)
    assert v.result.seeds.diffs == pytest.approx((0.1, 0.1, -0.03)) and v.result.seeds.unit == START_LEVEL
    assert v.result.boot.p_value > 0.05  # the bootstrap alone does not separate it either
    assert v.interval[0] < 0 < v.interval[1] and v.word == "inconclusive"

    # within each start, conditional on it, its four seeds are the units: +0.10 on A and B, -0.03 on C
    within = report.within["grpo"]
    assert list(within) == ["aaaa", "bbbb", "cccc"]
    for start, net in nets.items():
        w = within[start].verdicts["acc_final"]["ema"]
        assert w.result.seeds.unit == "seed" and w.result.point == pytest.approx(net / PROMPTS)
    assert "### GRPO within SFT start cccc" in report.markdown_path.read_text()

    text = report.tables["grpo"].verdict
    assert "Runs paired by SFT start and seed: 3 SFT starts × 4 seeds." in text
    assert "SFT starts, then seeds within SFT start, then prompts within seed" in text
    assert "Student-t test over the per-start mean differences (each SFT start's mean over its seeds)" in text
    assert "With 3 SFT starts, 12 seeds and 200 prompts" in text
    setup = dict(report.setup["grpo"])
    assert setup["SFT starts"] == ("3: aaaa (sft.seed 0, validation accuracy 0.500); bbbb (sft.seed 1, validation "
                                   "accuracy 0.510); cccc (sft.seed 2, validation accuracy 0.520)")
    header, body = header_and_cells(report.tables["grpo"])
    col = header.index("Δ final acc SFT-start-mean t 95%")
    row = next(cells for cells in body if cells[0] == "ema")
    mean = (0.1 + 0.1 - 0.03) / 3
    sd = math.sqrt(((0.1 - mean) ** 2 * 2 + (-0.03 - mean) ** 2) / 2)
    half = 4.302653 * sd / math.sqrt(3)  # t_{0.975, 2}
    assert row[col] == f"+{mean:.3f} ± {half:.3f}"
    assert [r.group.label for r in report.tables["grpo"].rows] == ["fixed", "ema"]  # sft.seed is not an arm


def test_hand_checked_tiny_nested_case():
    """2 starts × 2 seeds, one prompt each: start A's seeds differ by 1 and 0, start B's by 0 and 0 (point 0.25).
    A replicate is 0 when no draw of A, or one draw of A whose two seed draws are both the 0 seed, or two such:
    P = 1/4 + 1/2·1/4 + 1/4·1/16 = 0.390625. Pooling the 4 seeds as one level: P = (3/4)^4 = 0.316."""
    tree = {"A": {0: ([1.0], [0.0]), 1: ([0.0], [0.0])}, "B": {0: ([0.0], [0.0]), 1: ([0.0], [0.0])}}
    nested = paired_hierarchical_bootstrap(tree, levels=(START_LEVEL, "seed", "prompt"), n_boot=40000, seed=3)
    assert nested.point == 0.25
    assert np.mean(nested.replicates == 0) == pytest.approx(0.390625, abs=0.008)
    assert nested.replicates.mean() == pytest.approx(0.25, abs=0.005)  # balanced: unbiased for the point
    pooled = paired_hierarchical_bootstrap({i: leaf for i, leaf in enumerate(
        x for start in tree.values() for x in start.values())}, n_boot=40000, seed=3)
    assert np.mean(pooled.replicates == 0) == pytest.approx(0.75 ** 4, abs=0.008)


def test_hand_checked_start_mean_t(tmp_path):
    """2 starts × 2 seeds: start A's differences +0.5, 0 (mean +0.25), start B's 0, -0.25 (mean -0.125). The t over
    the 2 start means: mean +0.0625, se |0.25 + 0.125| / 2 = 0.1875, df 1, half-width 12.706 · 0.1875 = 2.382,
    two-sided p 1 - (2/π)·atan(1/3) = 0.795 (Student's t with 1 df is Cauchy)."""
    for k, (start, nets) in enumerate({"A": (100, 0), "B": (0, -50)}.items()):
        for seed, net in enumerate(nets):
            base = np.zeros(PROMPTS)
            base[100:] = 1.0
            write_run(tmp_path / f"fixed-{start}-{seed}", "fixed", seed, base, start=start, sft_seed=k)
            write_run(tmp_path / f"ema-{start}-{seed}", "ema", seed, shifted(base, net), start=start, sft_seed=k)
    c = comparison(tmp_path)
    assert c.starts == ["A", "A", "B", "B"] and c.seeds == [0, 1, 0, 1]
    t = c.result.seeds
    assert t.diffs == pytest.approx((0.25, -0.125))
    assert t.point == pytest.approx(0.0625) and t.se == pytest.approx(0.1875)
    lo, hi = t.percentile_interval(0.05)
    assert (lo, hi) == (pytest.approx(0.0625 - 12.7062 * 0.1875, abs=1e-3), pytest.approx(0.0625 + 12.7062 * 0.1875,
                                                                                            abs=1e-3))
    assert t.p_value == pytest.approx(1 - 2 / math.pi * math.atan(1 / 3))
    assert c.seed_t.mean == pytest.approx(0.0625) and c.seed_t.half_width == pytest.approx(12.7062 * 0.1875, abs=1e-3)
    assert c.result.point == pytest.approx(0.0625)


# ---------------------------------------------------------------- degenerate designs
def test_one_seed_per_start_resamples_starts_then_prompts(tmp_path):
    rng = np.random.default_rng(4)
    for k, (start, net) in enumerate({"A": 10, "B": 14, "C": 12}.items()):
        write_arm_pair(tmp_path, start, k, k, net, rng)  # start A seed 0, B seed 1, C seed 2
    c = comparison(tmp_path)
    assert c.result.levels == (START_LEVEL, "prompt") and c.result.n_units == (3, 3 * PROMPTS)
    assert c.result.note is None  # nothing left unresampled: a start is one run
    assert c.result.seeds.diffs == pytest.approx((0.05, 0.07, 0.06))
    report = build_report(tmp_path)
    assert "3 SFT starts × 1 seed." in report.tables["grpo"].verdict


def test_unequal_seeds_per_start_weigh_each_start_alike(tmp_path):
    """Start A holds 3 paired seeds (+0.10, +0.12, +0.08), start B one (-0.02): the point is the mean of the start
    means, (0.10 - 0.02) / 2 = 0.04, not the mean of the 4 runs (0.07)."""
    rng = np.random.default_rng(5)
    for seed, net in enumerate((20, 24, 16)):
        write_arm_pair(tmp_path, "A", 0, seed, net, rng)
    write_arm_pair(tmp_path, "B", 1, 0, -4, rng)
    c = comparison(tmp_path)
    assert c.seeds_per_start == {"A": 3, "B": 1}
    assert c.result.levels == (START_LEVEL, "seed", "prompt") and c.result.n_units == (2, 4, 4 * PROMPTS)
    assert c.result.point == pytest.approx(0.04) and c.result.seeds.diffs == pytest.approx((0.10, -0.02))
    assert "2 SFT starts × 1–3 seeds" in build_report(tmp_path).tables["grpo"].verdict


def test_a_start_missing_an_arm_leaves_that_arm_with_the_starts_it_has(tmp_path):
    """ema ran from starts A and B, none from A only: ema's comparison nests seeds in 2 starts; none's is the
    one-start analysis over A's seeds; the verdict names each comparison's design."""
    rng = np.random.default_rng(6)
    for k, start in enumerate(("A", "B")):
        for seed in range(3):
            base = (rng.random(PROMPTS) < 0.5).astype(float)
            write_run(tmp_path / f"fixed-{start}-{seed}", "fixed", seed, base, start=start, sft_seed=k)
            write_run(tmp_path / f"ema-{start}-{seed}", "ema", seed, shifted(base, 10), start=start, sft_seed=k)
            if start == "A":
                write_run(tmp_path / f"none-{start}-{seed}", "none", seed, shifted(base, 30), start=start, sft_seed=k)
    ema, none = comparison(tmp_path, "ema"), comparison(tmp_path, "none")
    assert ema.result.levels == (START_LEVEL, "seed", "prompt")
    assert none.result.levels == ("seed", "prompt") and none.starts == ["A"] * 3
    assert none.result.seeds.unit == "seed" and none.result.point == pytest.approx(0.15)
    text = build_report(tmp_path).tables["grpo"].verdict
    assert "Runs paired by SFT start and seed: ema 2 SFT starts × 3 seeds; none 1 SFT start × 3 seeds." in text


def test_a_seed_of_one_start_is_not_paired_with_the_same_seed_of_another(tmp_path):
    """ema's seed 0 from start A against fixed's seed 0 from start B is no pair: pairs need the start too."""
    rng = np.random.default_rng(7)
    base = (rng.random(PROMPTS) < 0.5).astype(float)
    write_run(tmp_path / "fixed-B-0", "fixed", 0, base, start="B", sft_seed=1)
    write_run(tmp_path / "ema-A-0", "ema", 0, shifted(base, 10), start="A", sft_seed=0)
    c = comparison(tmp_path)
    assert c.result is None and c.no_claim == "no common seed"


# ---------------------------------------------------------------- sft.seed is a replicate, not a setting
def test_sft_seed_is_averaged_over_like_the_seed_in_groups_and_wandb():
    common = dict(experiment="e", algo="grpo", strategy="fixed", task="arithmetic", loss_type=None, sweep="s")
    a = run_info(**common, overrides=["reference=fixed", "sft.seed=0", "training.seed=0"])
    b = run_info(**common, overrides=["reference=fixed", "sft.seed=1", "training.seed=0"])
    assert a["group"] == b["group"] and a["name"] != b["name"]


# ---------------------------------------------------------------- per-group intervals: the start is the replicate
def test_a_groups_own_interval_is_over_its_starts_means_not_its_runs(tmp_path):
    """2 starts × 3 seeds: the group's final-accuracy cell is the mean ± t interval over the 2 start means (1 df),
    with the evaluation's binomial noise, not over 6 runs as if they were independent; the cell says so."""
    rng = np.random.default_rng(4)
    for k, start in enumerate(("aaaa", "bbbb")):
        for seed in range(3):
            write_arm_pair(tmp_path, start, k, seed, 10 + seed, rng)
    report = build_report(tmp_path)
    fixed = next(r for r in report.tables["grpo"].rows if r.group.label == "fixed")
    per_run = {(r.sft_start, r.seed): r.final_from_status("eval/accuracy") for r in fixed.group.completed}
    means = [np.mean([v for (s, _), v in per_run.items() if s == start]) for start in ("aaaa", "bbbb")]
    est = fixed.cells["acc_final"]
    assert est.n == 2 and est.unit == START_LEVEL and est.values == pytest.approx(means)
    p = np.mean(means)
    half = math.hypot(t_dist.ppf(0.975, 1) * np.std(means, ddof=1) / math.sqrt(2),
                      1.959964 * math.sqrt(p * (1 - p) / PROMPTS))
    assert est.mean == pytest.approx(p) and est.half_width == pytest.approx(half, rel=1e-5)
    header, body = header_and_cells(report.tables["grpo"])
    cell = body[[b[0] for b in body].index("fixed")][header.index("final acc")]
    assert cell.endswith("(2 SFT starts)")
    one = build_report(tmp_path / "fixed-aaaa-0").tables["grpo"].rows[0].cells["acc_final"]
    assert one.unit == "seed" and one.n == 1


def test_an_unfinished_run_that_has_not_recorded_its_start_is_no_start_of_its_own(tmp_path):
    """A run records its SFT start in status.json when it ends: mid-sweep, a running run beside completed ones that
    recorded theirs is counted as not yet recorded, not as a second start (its fallback key, sft.seed=0)."""
    rng = np.random.default_rng(0)
    for seed in (0, 1, 2):
        write_arm_pair(tmp_path, "startA", 0, seed, 10, rng)
    running = tmp_path / "ema-running"
    write_run(running, "ema", 3, np.zeros(PROMPTS), start=None, seeds=(0, 1, 2, 3))
    status = json.loads((running / "status.json").read_text())
    write_status(running, {**status, "status": "running", "last_step": 1, "heartbeat": 4102444800.0})
    rows = dict(build_report(tmp_path).setup["grpo"])
    assert "SFT starts" not in rows
    assert rows["SFT start"].startswith("startA (validation accuracy 0.500)")
    assert rows["SFT start"].endswith("; 1 unfinished run not yet recorded")
