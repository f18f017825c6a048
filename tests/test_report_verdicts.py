"""The report's verdicts on synthetic sweeps written with the run record's writers (resolved_config.yaml,
status.json, metrics.jsonl, eval_outcomes.jsonl): the prompt-level interval, Holm over the family, the declared
comparison and the runs it leaves out, the exploratory report's explicit baseline, and the words allowed."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import yaml

from refexp.config import ComparisonConfig, ConfigError
from refexp.record import layout
from refexp.record.metrics import MetricsWriter
from refexp.record.outcomes import EvalOutcomes, append_outcomes
from refexp.record.resolved_config import write_resolved_config
from refexp.record.status import write_status
from refexp.report import build_report
from refexp.report.__main__ import main
from refexp.report.sections.how_to_read import HOW_TO_READ

STEPS, PROMPTS = 10, 200
BLOCK = {"arm_key": "grpo_variant", "arms": ["fixed", "ema", "none", "periodic_reset"], "baseline": "fixed",
         "seeds": [0, 1], "metric": "eval/accuracy", "at_steps": [], "chosen_on_test": ["algo.beta"]}
FORBIDDEN = re.compile(r"\bstops?\b|\bthe same\b|\bequal\b|does not order", re.IGNORECASE)


def flipped(base: np.ndarray, up: int, down: int, rng: np.random.Generator) -> np.ndarray:
    """``base`` [P] 0/1 scores with ``up`` wrong prompts made right and ``down`` right ones made wrong."""
    out = base.copy()
    out[rng.choice(np.flatnonzero(base == 0), up, replace=False)] = 1.0
    out[rng.choice(np.flatnonzero(base == 1), down, replace=False)] = 0.0
    return out


def write_run(run_dir, arm: str, seed: int, final: np.ndarray, *, commit: str = "abc", threads: int = 2,
              block: dict | None = BLOCK, outcomes: bool = True, retention: np.ndarray | None = None,
              gold: np.ndarray | None = None) -> None:
    """A completed GRPO run of arm ``arm`` (its ``grpo_variant`` and reference strategy) whose final evaluation
    scored ``final`` [P] (its step-0 evaluation: every prompt 0); with ``retention`` [P], its final
    ``eval/retention`` scores (at step 0 every retained prompt right); with ``gold`` [P], its final ``eval/gold``
    scores (at step 0 those of ``final``)."""
    run_dir.mkdir(parents=True)
    (run_dir / layout.HYDRA_DIR).mkdir()
    (run_dir / layout.HYDRA_DIR / "overrides.yaml").write_text(
        yaml.safe_dump([f"grpo_variant={arm}", f"training.seed={seed}"]))
    write_resolved_config(run_dir, {
        "algo": {"name": "grpo"}, "reference": {"name": arm}, "eval": {"num_prompts": PROMPTS},
        "training": {"seed": seed, "steps": STEPS, "num_threads": threads},
        "comparison": block or {"arm_key": "", "arms": [], "baseline": "", "seeds": []}})
    start = np.zeros(PROMPTS)
    log = MetricsWriter(run_dir)
    for step, scores, kept in ((0, start, np.ones(PROMPTS)), (STEPS, final, retention)):
        row = {"step": step, "eval/accuracy": float(scores.mean()), "reward/mean": 0.5}
        measured = [EvalOutcomes("eval", "eval/accuracy", list(range(PROMPTS)), scores.tolist())]
        if retention is not None:
            row["eval/retention"] = float(kept.mean())
            measured.append(EvalOutcomes("retain_eval", "eval/retention", list(range(PROMPTS)), kept.tolist()))
        if gold is not None:
            g = gold if step else final
            row["eval/gold"] = float(g.mean())
            measured.append(EvalOutcomes("eval", "eval/gold", list(range(PROMPTS)), g.tolist()))
        log.write(row)
        if outcomes:
            append_outcomes(run_dir, step, measured)
    log.close()
    write_status(run_dir, {"status": "completed", "algo": "grpo", "reference": arm, "seed": seed, "steps": STEPS,
                           "last_step": STEPS, "final": {"eval/accuracy": float(final.mean())},
                           "provenances": [{"commit": commit}]})


def noisy_sweep(root, *, outcomes: bool = True, block: dict | None = BLOCK) -> None:
    """fixed vs ema over 3 seeds: ema wins +6, +7, +5 of 200 prompts net (a steady seed-level gain), but
    disagrees with fixed on ~90 prompts per seed (prompt-level noise the seed-only interval leaves out)."""
    rng = np.random.default_rng(0)
    for seed, (up, down) in enumerate(((48, 42), (47, 40), (46, 41))):
        base = (rng.random(PROMPTS) < 0.5).astype(float)
        write_run(root / f"fixed-{seed}", "fixed", seed, base, block=block, outcomes=outcomes)
        write_run(root / f"ema-{seed}", "ema", seed, flipped(base, up, down, rng), block=block, outcomes=outcomes)


def verdict_of(report, label: str, key: str = "acc_final"):
    return report.tables["grpo"].verdicts[key][label]


@pytest.fixture
def declared_3_seeds():
    return {**BLOCK, "seeds": [0, 1, 2]}


# ---------------------------------------------------------------- (a) the prompts' noise
def test_a_seed_level_gain_drowned_by_prompt_noise_is_not_separated(tmp_path, declared_3_seeds):
    noisy_sweep(tmp_path / "seed_only", outcomes=False, block=declared_3_seeds)
    seed_only = build_report(tmp_path / "seed_only")
    v = verdict_of(seed_only, "ema")
    assert v.interval[0] > 0 and v.word == "higher"  # the seed-only t interval excludes 0
    assert "seed-only: the prompts' noise is not included" in seed_only.tables["grpo"].verdict

    noisy_sweep(tmp_path / "prompts", block=declared_3_seeds)
    report = build_report(tmp_path / "prompts")
    v = verdict_of(report, "ema")
    assert v.result.levels == ("seed", "prompt") and v.result.n_units == (3, 3 * PROMPTS)
    assert v.interval[0] < 0 < v.interval[1] and v.word == "inconclusive"
    text = report.tables["grpo"].verdict
    assert "ema - fixed: +0.030" in text and "against fixed, alpha 0.05): inconclusive." in text
    assert "paired hierarchical percentile bootstrap: seeds, then prompts within seed; B=10000" in text
    assert "With 3 seeds and 200 prompts, the smallest difference detected with 80% power" in text
    assert "seed-only" not in text
    at = build_report(tmp_path / "prompts", at_steps=[STEPS // 2])  # the evaluation at or before step 5: step 0
    v0 = verdict_of(at, "ema", "acc_at_5")
    # step 0: every run scored 0 on every prompt, so the 3 per-seed differences are 0 each: a t without spread
    assert v0.result.point == 0.0 and v0.result.levels == ("seed", "prompt") and v0.word == "degenerate t"
    assert "held-out accuracy at step 5, paired against fixed" in at.tables["grpo"].verdict
    md = (tmp_path / "prompts" / "report.md").read_text()
    assert "pre-registered in the experiment config" in md and "| chosen on test | algo.beta" in md


def test_a_gain_the_seeds_disagree_on_is_not_separated_though_its_prompts_agree(tmp_path, declared_3_seeds):
    """3 seeds whose gains differ (+20, +2, +40 prompts of 200, no prompt lost): resampling 3 seeds and their
    prompts never reaches 0, but Student's t over 3 per-seed differences (2 degrees of freedom) does, and a
    difference counts only where both tests reject."""
    rng = np.random.default_rng(1)
    for seed, up in enumerate((20, 2, 40)):
        base = np.zeros(PROMPTS)
        base[:100] = 1.0
        write_run(tmp_path / f"fixed-{seed}", "fixed", seed, base, block=declared_3_seeds)
        write_run(tmp_path / f"ema-{seed}", "ema", seed, flipped(base, up, 0, rng), block=declared_3_seeds)
    v = verdict_of(build_report(tmp_path), "ema")
    assert v.result.boot.percentile_interval(0.05)[0] > 0  # the bootstrap alone would claim "higher"
    assert v.result.seeds.percentile_interval(0.05)[0] < 0 < v.interval[1]
    assert v.interval[0] < 0 and v.word == "inconclusive"


# ---------------------------------------------------------------- (b) Holm
def test_holm_takes_back_a_separation_the_unadjusted_test_would_claim(tmp_path):
    """Three arms against fixed: one far above, one near p 0.03 alone, one null. Unadjusted, the second is
    higher; Holm multiplies its p by 2 and it is not separated."""
    rng = np.random.default_rng(1)
    # (prompts made right, made wrong) per seed; the seeds' nets differ, so the t over them has a spread
    nets = {"none": ((60, 10), (61, 10)), "ema": ((15, 5), (16, 5)), "periodic_reset": ((20, 20), (21, 20))}
    for seed in (0, 1):
        base = (rng.random(PROMPTS) < 0.5).astype(float)
        write_run(tmp_path / f"fixed-{seed}", "fixed", seed, base)
        for arm, flips in nets.items():
            write_run(tmp_path / f"{arm}-{seed}", arm, seed, flipped(base, *flips[seed], rng))
    report = build_report(tmp_path)
    ema = verdict_of(report, "ema")
    assert ema.family_size == 3
    assert ema.result.p_value < 0.05 and ema.result.interval[0] > 0  # unadjusted: higher
    assert ema.p_holm > 0.05 and ema.word == "inconclusive"
    assert verdict_of(report, "none").word == "higher"
    assert "Family: 3 comparisons against fixed, Holm-adjusted, alpha 0.05." in report.tables["grpo"].verdict
    loose = build_report(tmp_path, alpha=0.2)  # --alpha: the family's rate
    assert verdict_of(loose, "ema").word == "higher"


# ---------------------------------------------------------------- (c) runs outside the plan
def test_runs_of_another_commit_or_seed_are_listed_and_left_out_unless_allow_mixed(tmp_path):
    rng = np.random.default_rng(2)
    for seed in (0, 1, 2):  # seed 2 is outside the declared seeds 0, 1
        base = (rng.random(PROMPTS) < 0.5).astype(float)
        write_run(tmp_path / f"fixed-{seed}", "fixed", seed, base)
        write_run(tmp_path / f"ema-{seed}", "ema", seed, flipped(base, 30, 10, rng),
                  commit="def" if seed == 1 else "abc")
    base = (rng.random(PROMPTS) < 0.5).astype(float)
    write_run(tmp_path / "fixed-t", "fixed", 3, base, threads=8)
    report = build_report(tmp_path)
    setup = dict(report.setup["grpo"])
    left = setup["left out of the verdict"]
    assert "run ema-1: refexp commit def, not the majority's abc" in left
    assert "seed 2 is outside the declared seeds 0, 1" in left
    assert "run fixed-t:" in left and "training.num_threads=8, not the majority's 2" in left
    c = report.tables["grpo"].rows[1].paired["acc_final"]
    assert c.label == "ema" and c.seeds == [0]  # seed 1's ema run (another commit) and seed 2 left out
    assert "ema-1" in report.plan.excluded

    mixed = build_report(tmp_path, allow_mixed=True)
    assert mixed.tables["grpo"].rows[1].paired["acc_final"].seeds == [0, 1, 2]
    assert "run ema-1: refexp commit def" in dict(mixed.setup["grpo"])["outside the plan, counted (--allow-mixed)"]


# ---------------------------------------------------------------- (d) no block: exploratory
def test_a_sweep_without_a_comparison_block_is_exploratory_against_fixed_or_its_first_group(tmp_path):
    noisy_sweep(tmp_path / "ad_hoc", block=None)
    assert main([str(tmp_path / "ad_hoc"), "--quiet"]) == 0
    md = (tmp_path / "ad_hoc" / "report.md").read_text()
    assert "exploratory: not pre-registered" in md
    assert "| baseline | fixed (no comparison declared, no --baseline named: a group is fixed) |" in md
    assert "Family: 1 comparison against fixed, Holm-adjusted" in md
    table = build_report(tmp_path / "ad_hoc").tables["grpo"]  # the sweep callback's report: the same
    assert set(table.verdicts["acc_final"]) == {"ema"} and "exploratory" in table.verdict

    assert main([str(tmp_path / "ad_hoc"), "--baseline", "ema", "--quiet"]) == 0  # named: that one
    assert "| baseline | ema (--baseline) |" in (tmp_path / "ad_hoc" / "report.md").read_text()

    rng = np.random.default_rng(1)  # no fixed group: the first group in the report's order
    for seed in range(2):
        base = (rng.random(PROMPTS) < 0.5).astype(float)
        write_run(tmp_path / "no_fixed" / f"ema-{seed}", "ema", seed, base, block=None)
        write_run(tmp_path / "no_fixed" / f"none-{seed}", "none", seed, flipped(base, 10, 5, rng), block=None)
    report = build_report(tmp_path / "no_fixed")
    assert report.plan.baseline == report.tables["grpo"].rows[0].group.label == "ema"
    assert set(report.tables["grpo"].verdicts["acc_final"]) == {"none"}
    assert "no group is fixed: the first group" in report.plan.baseline_why


def test_a_baseline_other_than_the_declared_one_makes_the_report_exploratory(tmp_path, declared_3_seeds):
    noisy_sweep(tmp_path, block=declared_3_seeds)
    assert "pre-registered" in build_report(tmp_path).tables["grpo"].verdict
    report = build_report(tmp_path, baseline="ema")
    assert report.tables["grpo"].baseline == "ema"
    assert "exploratory: not pre-registered" in report.tables["grpo"].verdict


# ---------------------------------------------------------------- (e) words
def null_sweep(root, n_seeds: int, block: dict | None = BLOCK) -> None:
    """fixed vs ema with a true difference of 0: per seed ema makes 18-24 wrong prompts right and 20-23 right ones
    wrong (nets +4, -3, +2, -4, +3, -2, 0, -1 of 200 prompts over seeds 0-7)."""
    rng = np.random.default_rng(3)
    flips = ((24, 20), (18, 21), (22, 20), (19, 23), (23, 20), (20, 22), (21, 21), (20, 21))
    for seed in range(n_seeds):
        base = (rng.random(PROMPTS) < 0.5).astype(float)
        write_run(root / f"fixed-{seed}", "fixed", seed, base, block=block)
        write_run(root / f"ema-{seed}", "ema", seed, flipped(base, *flips[seed], rng), block=block)


def test_a_true_difference_of_0_is_equivalent_with_enough_seeds_and_inconclusive_with_few(tmp_path):
    """Three verdicts, not two: with 8 seeds the two one-sided tests at the declared margin ±0.05 put the
    difference inside it; with 2 seeds (a t with 1 df) they cannot, and the verdict is inconclusive with its
    interval. The margin is the declared block's ``equivalence_margin``."""
    declared = {**BLOCK, "seeds": list(range(8)), "equivalence_margin": 0.05}
    null_sweep(tmp_path / "eight", 8, declared)
    v = verdict_of(build_report(tmp_path / "eight"), "ema")
    assert v.result.seeds.df == 7 and abs(v.result.point) < 0.01
    assert v.word == "equivalent within ±0.05" and -0.05 < v.equivalence.interval[0] < v.equivalence.interval[1] < 0.05
    null_sweep(tmp_path / "two", 2, declared)
    report = build_report(tmp_path / "two")
    v = verdict_of(report, "ema")
    assert v.result.seeds.df == 1 and v.word == "inconclusive" and not v.equivalence.equivalent
    assert v.phrase == f"inconclusive (interval [{v.interval[0]:+.3f}, {v.interval[1]:+.3f}])"
    summary = json.loads(report.summary_path.read_text())
    assert summary["comparison"]["equivalence_margin"] == 0.05
    cell = summary["algos"]["grpo"]["groups"][1]["paired_vs_baseline"]["acc_final"]
    assert cell["verdict"] == "inconclusive" and cell["verdict_text"] == v.phrase
    bad = build_report(tmp_path / "two", comparison={**declared, "equivalence_margin": -0.05})
    assert bad.plan.problem.startswith("comparison.equivalence_margin=-0.05 is invalid") and not bad.plan.declared


def test_equivalence_is_claimed_only_with_a_margin_and_no_verdict_uses_a_forbidden_word(tmp_path):
    null_sweep(tmp_path, 8, {**BLOCK, "seeds": list(range(8))})
    plain = build_report(tmp_path)
    assert verdict_of(plain, "ema").word == "inconclusive"
    report = build_report(tmp_path, margin=0.05)  # --equivalence-margin
    assert verdict_of(report, "ema").word == "equivalent within ±0.05"
    assert "Equivalence margin ±0.05: two one-sided tests" in report.tables["grpo"].verdict
    for text in (plain.tables["grpo"].verdict, report.tables["grpo"].verdict, HOW_TO_READ,
                 (tmp_path / "report.md").read_text(), (tmp_path / "summary.json").read_text()):
        assert not FORBIDDEN.search(text), FORBIDDEN.search(text)


# ---------------------------------------------------------------- the block
def test_the_declared_baseline_must_be_an_arm():
    with pytest.raises(ConfigError, match="comparison.baseline='dpo' is invalid: expected one of comparison.arms"):
        ComparisonConfig(arm_key="grpo_variant", arms=["fixed", "ema"], baseline="dpo", seeds=[0])
    with pytest.raises(ConfigError, match="comparison.seeds"):
        ComparisonConfig(arm_key="grpo_variant", arms=["fixed", "ema"], baseline="fixed", seeds=[])
    assert not ComparisonConfig().declared  # the default declares nothing


# ---------------------------------------------------------------- gold, an endpoint like accuracy
def test_gold_under_a_learned_reward_is_its_own_paired_family(tmp_path, declared_3_seeds):
    """Under a learned reward eval/accuracy is the proxy: two arms with the same proxy scores, where no reference
    loses 40-50 of 200 prompts' gold and the fixed reference none, are separated on the gold endpoint (from the
    gold outcomes) and not on the proxy one."""
    rng = np.random.default_rng(3)
    for seed, lost in enumerate((40, 50, 45)):
        proxy = (rng.random(PROMPTS) < 0.5).astype(float)
        write_run(tmp_path / f"fixed-{seed}", "fixed", seed, proxy, block=declared_3_seeds, gold=proxy)
        write_run(tmp_path / f"none-{seed}", "none", seed, proxy, block=declared_3_seeds,
                  gold=flipped(proxy, 0, lost, rng))
    report = build_report(tmp_path)
    table = report.tables["grpo"]
    assert [e.key for e in table.endpoints] == ["acc_final", "gold_final"]
    v = verdict_of(report, "none", "gold_final")
    assert v.result.point == pytest.approx(-(40 + 50 + 45) / (3 * PROMPTS))
    assert v.word == "lower" and v.interval[1] < 0
    assert verdict_of(report, "none").result.point == 0.0
    assert "final held-out gold reward, paired against fixed" in table.verdict


# ---------------------------------------------------------------- retention, an endpoint like accuracy
def test_retention_has_its_column_and_its_own_paired_family(tmp_path, declared_3_seeds):
    """Three seeds where no reference forgets 30-40 of the 200 retained prompts and the fixed reference forgets
    0-2, while their accuracies are the same: the retention endpoint separates them (paired by seed and prompt,
    from the retention outcomes, not the accuracy ones) and the accuracy endpoint does not."""
    rng = np.random.default_rng(2)
    for seed, (lost_none, lost_fixed) in enumerate(((30, 0), (40, 2), (35, 1))):
        acc = (rng.random(PROMPTS) < 0.5).astype(float)
        kept = np.ones(PROMPTS)
        write_run(tmp_path / f"fixed-{seed}", "fixed", seed, acc, block=declared_3_seeds,
                  retention=flipped(kept, 0, lost_fixed, rng))
        write_run(tmp_path / f"none-{seed}", "none", seed, acc, block=declared_3_seeds,
                  retention=flipped(kept, 0, lost_none, rng))
    report = build_report(tmp_path)
    table = report.tables["grpo"]
    assert [e.key for e in table.endpoints] == ["acc_final", "retention_final"]
    v = verdict_of(report, "none", "retention_final")
    assert v.result.levels == ("seed", "prompt") and v.result.n_units == (3, 3 * PROMPTS)
    assert v.result.point == pytest.approx(-(30 + 40 + 35 - 3) / (3 * PROMPTS))
    assert v.word == "lower" and v.interval[1] < 0
    assert verdict_of(report, "none").result.point == 0.0  # the same accuracy: no difference there
    row = {r.group.label: r for r in table.rows}
    assert row["none"].cells["retention_change"].mean == pytest.approx(-(30 + 40 + 35) / (3 * PROMPTS))
    assert row["fixed"].cells["retention_final"].mean == pytest.approx(1 - 3 / (3 * PROMPTS))
    assert "final held-out retention, paired against fixed" in table.verdict
