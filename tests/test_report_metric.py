"""``comparison.metric`` names the headline: any held-out metric with per-prompt outcomes (``eval/gold``, a
learned-reward run's gold reward, not its proxy ``eval/accuracy``). The verdicts, the at-step columns, the first
screen, summary.json and the power plan read it; a name that is not such a metric is one error naming the field
and the valid ones, in the config and in a run's recorded block."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from refexp.config import ComparisonConfig, ConfigError
from refexp.config.comparison import COMPARED_METRICS
from refexp.record.metric_names import BY_NAME
from refexp.report import build_report
from refexp.report.__main__ import main
from refexp.report.power.pilot import from_sweep
from tests.helpers.primary_sweeps import PROMPTS, block, flipped, write_run


def proxy_up_gold_down(root, decl) -> dict[str, list[float]]:
    """fixed and ema over two seeds: ema's proxy (eval/accuracy) far above fixed's, its gold (eval/gold) below, the
    regime where optimising a learned reward hurts the true one. Returns arm -> its final gold mean per seed."""
    rng = np.random.default_rng(7)
    golds: dict[str, list[float]] = {"fixed": [], "ema": []}
    for seed in (0, 1):
        proxy, gold = (rng.random(PROMPTS) < 0.5).astype(float), (rng.random(PROMPTS) < 0.6).astype(float)
        write_run(root / f"fixed-{seed}", "fixed", seed, proxy, decl=decl, gold=gold)
        ema_gold = flipped(gold, 4, 40 + 2 * seed, rng)
        write_run(root / f"ema-{seed}", "ema", seed, flipped(proxy, 60 + 6 * seed, 2, rng), decl=decl, gold=ema_gold)
        golds["fixed"].append(gold.mean())
        golds["ema"].append(ema_gold.mean())
    return golds


def test_the_verdict_is_computed_on_the_declared_gold_metric(tmp_path):
    decl = block(["fixed", "ema"], primary=["ema"], metric="eval/gold", at_steps=[5])
    golds = proxy_up_gold_down(tmp_path, decl)
    report = build_report(tmp_path)
    table = report.tables["grpo"]

    assert table.headline.key == "gold_final" and table.endpoints[0].key == "gold_final"
    assert table.endpoints[0].metric == "eval/gold"
    assert [ep.key for ep in table.endpoints] == ["gold_final", "acc_final", "gold_at_5"]
    gold = table.verdicts["gold_final"]["ema"]
    assert table.roles["gold_final"] == {"ema": "primary"} and table.roles["acc_final"] == {"ema": "secondary"}
    assert gold.result.point == pytest.approx(np.mean(golds["ema"]) - np.mean(golds["fixed"]))
    assert gold.word == "lower" and table.verdicts["acc_final"]["ema"].word == "higher"  # the proxy says otherwise
    assert table.endpoints[2].metric == "eval/gold"
    assert table.rows[1].paired["gold_at_5"].result.point == pytest.approx(0)

    md = (tmp_path / "report.md").read_text()
    first = md.split("\n## ", 2)[1]
    assert "Headline metric (comparison.metric): eval/gold, compared at its final value and at steps 5." in first
    (line,) = [ln for ln in first.splitlines() if ln.startswith("| ema − fixed")]
    assert line.startswith(f"| ema − fixed | final held-out gold reward | {gold.result.point:+.3f} |")
    assert "| declared | arms fixed, ema (grpo_variant); baseline fixed; seeds 0, 1; metric eval/gold" in md
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["comparison"]["metric"] == "eval/gold" and summary["algos"]["grpo"]["headline"] == "gold_final"
    assert summary["primary_contrasts"][0]["endpoint"] == "final held-out gold reward"
    assert summary["primary_contrasts"][0]["difference"] == pytest.approx(gold.result.point)


def test_the_power_plan_reads_the_declared_metric(tmp_path, capsys):
    decl = block(["fixed", "ema"], primary=["ema"], metric="eval/gold")
    proxy_up_gold_down(tmp_path / "pilot", decl)
    experiment = tmp_path / "gold_exp.yaml"
    experiment.write_text(yaml.safe_dump({"comparison": decl, "eval": {"num_prompts": PROMPTS}}))
    assert main(["--plan", str(experiment), "--pilot", str(tmp_path / "pilot")]) == 0
    text = capsys.readouterr().out
    assert "- primary contrasts: ema - fixed on eval/gold (final values)" in text
    gold, proxy = from_sweep(tmp_path / "pilot", "eval/gold"), from_sweep(tmp_path / "pilot", "eval/accuracy")
    assert gold.components != proxy.components
    assert f"| prompts (prompt × arm, shared by every run) | {gold.components.prompt:.3g} |" in text


@pytest.mark.parametrize("metric", ["val/gold", "reward/gold", "loss/total", "eval/glod"])
def test_a_metric_that_is_not_a_compared_held_out_metric_is_one_error_naming_the_field(metric):
    valid = "one of eval/accuracy, eval/retention, eval/gold"
    for arms in ({}, {"arm_key": "grpo_variant", "arms": ["fixed", "ema"], "baseline": "fixed", "seeds": [0]}):
        with pytest.raises(ConfigError) as e:
            ComparisonConfig(metric=metric, **arms)
        message = str(e.value)
        assert message.startswith(f"comparison.metric={metric!r} is invalid: expected a held-out metric")
        assert valid in message and "\n" not in message


def test_every_compared_metric_is_a_registered_held_out_metric():
    assert all(m.startswith("eval/") and m in BY_NAME for m in COMPARED_METRICS)
    for metric in COMPARED_METRICS:
        ComparisonConfig(arm_key="grpo_variant", arms=["fixed", "ema"], baseline="fixed", seeds=[0], metric=metric)


def test_a_run_recording_a_bad_metric_gives_one_line_then_the_exploratory_report(tmp_path, capsys):
    proxy_up_gold_down(tmp_path, block(["fixed", "ema"], primary=["ema"], metric="val/gold"))
    assert main([str(tmp_path), "--quiet"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["refexp-report: the comparison block cannot be read (comparison.metric='val/gold' is invalid: "
                   "expected a held-out metric the report compares per prompt, one of eval/accuracy, "
                   "eval/retention, eval/gold): the report is exploratory"]
    assert json.loads((tmp_path / "summary.json").read_text())["algos"]["grpo"]["headline"] == "acc_final"
