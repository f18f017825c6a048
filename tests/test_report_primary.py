"""The comparison block's primary contrasts: Holm over them alone, every other comparison labelled secondary; the
block's fields checked with one clear error; an unreadable block in a run's config makes the report exploratory
with one line, not a crash; a setting the algorithm does not read (GRPO's β without a reference) makes no group."""

from __future__ import annotations

import json

import numpy as np
import pytest

from refexp.config import ComparisonConfig, ConfigError
from refexp.report import build_report
from refexp.report.__main__ import main
from refexp.report.reading.group import group_runs
from refexp.report.reading.load import load_sweep
from tests.helpers.primary_sweeps import PROMPTS, block, flipped, write_run

NETS = {"none": ((60, 10), (58, 12)), "ema": ((30, 18), (27, 18)), "periodic_reset": ((20, 20), (21, 19))}
"""Prompts each arm wins and loses against fixed, per seed: far above, a little above, null."""


def three_arms(root, decl):
    rng = np.random.default_rng(1)
    for seed in (0, 1):
        base = (rng.random(PROMPTS) < 0.5).astype(float)
        write_run(root / f"fixed-{seed}", "fixed", seed, base, decl=decl)
        for arm, nets in NETS.items():
            write_run(root / f"{arm}-{seed}", arm, seed, flipped(base, *nets[seed], rng), decl=decl)


def test_holm_runs_over_the_primary_contrasts_alone_and_the_rest_is_secondary(tmp_path):
    arms = ["fixed", *NETS]
    three_arms(tmp_path / "all", block(arms))
    three_arms(tmp_path / "one", block(arms, primary=["ema"]))
    everything = build_report(tmp_path / "all").tables["grpo"]
    primary = build_report(tmp_path / "one").tables["grpo"]

    assert set(everything.roles["acc_final"].values()) == {"secondary"}  # no primary declared: no claim
    assert everything.verdicts["acc_final"]["ema"].family_size == 3
    ema = primary.verdicts["acc_final"]["ema"]
    assert primary.roles["acc_final"] == {"ema": "primary", "none": "secondary", "periodic_reset": "secondary"}
    assert ema.family_size == 1 and ema.p_holm == pytest.approx(ema.result.p_value)  # Holm over one: unadjusted
    assert ema.p_holm < everything.verdicts["acc_final"]["ema"].p_holm
    assert primary.verdicts["acc_final"]["none"].family_size == 2  # the secondary family: none, periodic_reset
    first, second = primary.verdict.split("\n\n")[:2]
    assert first.startswith("Primary contrasts (comparison.primary: ema;") and "ema - fixed" in first
    assert "none - fixed" not in first and second.startswith("Secondary: not a declared primary contrast")

    summary = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert summary["comparison"]["primary"] == ["ema"]
    roles = {g["label"]: g["paired_vs_baseline"]["acc_final"]["role"]
             for g in summary["algos"]["grpo"]["groups"] if g["paired_vs_baseline"]}
    assert roles == {"ema": "primary", "none": "secondary", "periodic_reset": "secondary"}


def test_a_declared_margin_is_the_equivalence_margin_and_another_one_is_post_hoc(tmp_path):
    three_arms(tmp_path, block(["fixed", *NETS], primary=["periodic_reset"], equivalence_margin=0.2))
    report = build_report(tmp_path)
    assert report.plan.margin == 0.2
    assert report.tables["grpo"].verdicts["acc_final"]["periodic_reset"].equivalence.margin == 0.2
    other = build_report(tmp_path, margin=0.1)
    assert other.plan.margin == 0.1
    assert any("replaces the declared comparison.equivalence_margin 0.2: the equivalence claims are post hoc" in n
               for n in other.plan.notes)


@pytest.mark.parametrize("fields, named, valid", [
    ({"primary": ["dpo"]}, "comparison.primary=['dpo']", "distinct arms other than the baseline (ema, none)"),
    ({"primary": ["fixed"]}, "comparison.primary=['fixed']", "distinct arms other than the baseline (ema, none)"),
    ({"primary": ["ema", "none", "ema"]}, "comparison.primary=['ema', 'none', 'ema']",
     "distinct arms other than the baseline"),
    ({"metrics": ["eval/reward"]}, "comparison.metrics=['eval/reward']", "distinct metrics among eval/accuracy"),
    ({"equivalence_margin": 0.0}, "comparison.equivalence_margin=0.0", "a number > 0"),
    ({"equivalence_margin": -1}, "comparison.equivalence_margin=-1", "a number > 0"),
])
def test_a_bad_field_of_the_block_is_one_error_naming_it_and_what_is_valid(fields, named, valid):
    with pytest.raises(ConfigError) as e:
        ComparisonConfig(arm_key="grpo_variant", arms=["fixed", "ema", "none"], baseline="fixed", seeds=[0], **fields)
    assert str(e.value).startswith(named + " is invalid: expected") and valid in str(e.value), str(e.value)


def test_more_than_three_primaries_and_primaries_without_arms_are_refused():
    arms = ["fixed", "a", "b", "c", "d"]
    with pytest.raises(ConfigError, match=r"comparison.primary=.* expected one to 3 arms"):
        ComparisonConfig(arm_key="grpo_variant", arms=arms, baseline="fixed", seeds=[0], primary=arms[1:])
    ComparisonConfig(arm_key="grpo_variant", arms=arms, baseline="fixed", seeds=[0], primary=arms[1:4])
    with pytest.raises(ConfigError, match=r"comparison.primary=\['a'\] is invalid: expected empty without "
                                          r"comparison.arms"):
        ComparisonConfig(primary=["a"])


def test_a_block_without_arm_key_gives_one_line_then_the_exploratory_report(tmp_path, capsys):
    decl = block(["fixed", *NETS], primary=["ema"])
    del decl["arm_key"]
    three_arms(tmp_path, decl)
    assert main([str(tmp_path), "--quiet"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["refexp-report: the comparison block cannot be read (comparison.arm_key=None is invalid: expected "
                   "the swept key naming the arms (grpo_variant, dpo_variant, reference)): the report is exploratory"]
    md = (tmp_path / "report.md").read_text()
    assert "exploratory: not pre-registered" in md and "| baseline | fixed (no comparison declared" in md
    assert "the comparison block cannot be read (comparison.arm_key=None" in md


def test_none_at_four_betas_is_one_group_and_its_repeats_are_not_counted_again(tmp_path):
    rng = np.random.default_rng(2)
    for seed in (0, 1):
        base = (rng.random(PROMPTS) < 0.5).astype(float)
        write_run(tmp_path / f"fixed-{seed}", "fixed", seed, base, decl=None, beta=1.0)
        up = flipped(base, 20, 5, rng)
        for beta in (0.01, 0.04, 0.2, 1.0):  # beta does not act on none: one configuration, four runs
            write_run(tmp_path / f"none-{beta:g}-{seed}", "none", seed, up, decl=None, beta=beta)
    (grpo,) = group_runs(load_sweep(tmp_path)).values()
    assert [g.label for g in grpo] == ["fixed (algo.beta=1)", "none"]
    none = grpo[1]
    assert [r.seed for r in none.completed] == [0, 1] and len(none.repeats) == 6
    assert sorted(none.unread["algo.beta"], key=float) == ["0.01", "0.04", "0.2", "1"]
    report = build_report(tmp_path)
    table = report.tables["grpo"]
    assert table.verdicts["acc_final"]["none"].family_size == 1
    assert table.rows[1].paired["acc_final"].seeds == [0, 1]
    assert any(n.startswith("none: one group over algo.beta = 0.01, 0.04, 0.2, 1: GRPO does not read algo.beta "
                            "with reference none") for n in report.notes)


def test_the_first_screen_is_the_primary_contrasts_one_line_each_and_the_method_once(tmp_path):
    three_arms(tmp_path, block(["fixed", *NETS], primary=["ema", "none"]))
    report = build_report(tmp_path)
    md = (tmp_path / "report.md").read_text()
    first = md.split("\n## ", 2)[1]  # the first section after the title and the counts
    assert first.startswith("Primary contrasts\n")
    rows = [line for line in first.splitlines() if line.startswith("| ") and "−" in line]
    ema, none = (report.tables["grpo"].verdicts["acc_final"][a] for a in ("ema", "none"))
    assert rows == [
        f"| ema − fixed | final held-out accuracy | {ema.result.point:+.3f} | {ema.interval_text} (97.5%) | "
        f"{ema.word} | ±{ema.mdd:.3f} |",
        f"| none − fixed | final held-out accuracy | {none.result.point:+.3f} | {none.interval_text} (97.5%) | "
        f"{none.word} | ±{none.mdd:.3f} |"]
    assert "periodic_reset" not in first and first.count("docs/runs.md") == 1
    assert md.index("## GRPO") > md.index("## Primary contrasts") and md.rstrip().endswith(
        md.split("## How to read this\n\n", 1)[1].rstrip())  # the long how-to-read comes last
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [p["contrast"] for p in summary["primary_contrasts"]] == ["ema − fixed", "none − fixed"]
    html = (tmp_path / "report.html").read_text()
    assert (html.index("<h2>Primary contrasts</h2>") < html.index("<h2>GRPO</h2>")
            < html.index("<h2>How to read this</h2>"))

    three_arms(tmp_path / "undeclared", block(["fixed", *NETS]))
    build_report(tmp_path / "undeclared")
    md = (tmp_path / "undeclared" / "report.md").read_text()
    assert "declares no primary contrast (comparison.primary): this report claims nothing in its summary" in md


def test_the_report_reads_the_primary_metrics_and_limit_the_config_accepts():
    """The report cannot import the config layer (docs/architecture.md), so it keeps its own copies: they agree."""
    from refexp.config import comparison as config
    from refexp.report.reading import comparison_plan

    assert tuple(comparison_plan.PRIMARY_ENDPOINTS) == config.PRIMARY_METRICS
    assert comparison_plan.MAX_PRIMARY == config.MAX_PRIMARY
    assert comparison_plan.MATCHED_AXES == config.MATCHED_AXES
    assert config.MatchedConfig().axis == comparison_plan.MATCHED_AXES[0]


def test_primary_contrasts_on_two_metrics_are_one_family(tmp_path):
    rng = np.random.default_rng(4)
    decl = block(["fixed", "ema", "none"], primary=["ema"], metrics=["eval/accuracy", "eval/retention"])
    for seed in (0, 1):
        base, kept = (rng.random(PROMPTS) < 0.5).astype(float), (rng.random(PROMPTS) < 0.8).astype(float)
        write_run(tmp_path / f"fixed-{seed}", "fixed", seed, base, decl=decl, retention=kept)
        for arm in ("ema", "none"):
            write_run(tmp_path / f"{arm}-{seed}", arm, seed, flipped(base, 25, 10, rng), decl=decl,
                      retention=flipped(kept, 5, 20, rng))
    table = build_report(tmp_path).tables["grpo"]
    acc, kept = table.verdicts["acc_final"]["ema"], table.verdicts["retention_final"]["ema"]
    assert acc.family_size == kept.family_size == 2  # Holm over ema on both metrics together
    assert table.roles["retention_final"] == {"ema": "primary", "none": "secondary"}
    assert table.verdicts["retention_final"]["none"].family_size == 1
    paragraphs = table.verdict.split("\n\n")
    assert paragraphs[0].startswith("Primary contrasts (comparison.primary: ema; one Holm family over them and the "
                                    "primary metrics eval/accuracy, eval/retention")
    assert paragraphs[1].startswith("Primary contrasts, continued") and "final retention" in paragraphs[1]
    assert all(p.startswith("Secondary") for p in paragraphs[2:]) and len(paragraphs) == 4
