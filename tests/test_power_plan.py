"""The power plan (``refexp-report --plan EXPERIMENT --pilot PILOT``): variance components from a pilot sweep by the
method of moments, checked against an independent least-squares computation and the components the sweep was
simulated with; the plan's command line; the committed plans regenerate from the pilots they name."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from refexp.report.__main__ import main
from refexp.report.power.design import full_plan
from refexp.report.power.detectable import Components, Design, design_detectable_difference
from refexp.report.power.experiment import read_experiment
from refexp.report.power.pilot import from_sweep, read_pilot
from refexp.report.power.plan import design_of, plan_text
from tests.helpers.primary_sweeps import block, write_run

ROOT = Path(__file__).resolve().parent.parent
TRUE = Components(start=0.004, seed=0.002, prompt=0.05, residual=0.2)
STARTS, SEEDS, PROMPTS = 4, 3, 200


def simulated_sweep(root: Path) -> np.ndarray:
    """fixed scores 0.5 on every prompt; ema 0.5 + d[s, k, p] drawn from ``TRUE``'s model. Returns d [S·K, P]."""
    rng = np.random.default_rng(0)
    c = rng.normal(0, TRUE.prompt ** 0.5, PROMPTS)
    rows = []
    decl = block(["fixed", "ema"], primary=["ema"], seeds=list(range(SEEDS)))
    for s in range(STARTS):
        a = rng.normal(0, TRUE.start ** 0.5)
        for k in range(SEEDS):
            d = 0.03 + a + rng.normal(0, TRUE.seed ** 0.5) + c + rng.normal(0, TRUE.residual ** 0.5, PROMPTS)
            write_run(root / f"fixed-{s}-{k}", "fixed", k, np.full(PROMPTS, 0.5), decl=decl, sft_seed=s)
            write_run(root / f"ema-{s}-{k}", "ema", k, 0.5 + d, decl=decl, sft_seed=s)
            rows.append(d)
    return np.array(rows)


def by_least_squares(d: np.ndarray) -> Components:
    """The same moments, the residual from an additive units + prompts least-squares fit."""
    n_units, n_prompts = d.shape
    x = np.hstack([np.kron(np.eye(n_units), np.ones((n_prompts, 1))),
                   np.kron(np.ones((n_units, 1)), np.eye(n_prompts))])
    fit, *_ = np.linalg.lstsq(x, d.ravel(), rcond=None)
    residual = float(((d.ravel() - x @ fit) ** 2).sum() / ((n_units - 1) * (n_prompts - 1)))
    prompt = (n_units * d.mean(0).var(ddof=1) - residual) / n_units
    means = d.mean(1).reshape(STARTS, SEEDS)
    within = float(means.var(axis=1, ddof=1).mean())
    return Components(means.mean(1).var(ddof=1) - within / SEEDS, within - residual / n_prompts, prompt, residual)


def test_a_sweep_pilot_gives_the_moments_of_its_differences(tmp_path):
    d = simulated_sweep(tmp_path)
    pilot = from_sweep(tmp_path)
    assert pilot.comparisons == ["ema - fixed"] and pilot.prompts == PROMPTS
    hand = by_least_squares(d)
    for name in ("start", "seed", "prompt", "residual"):
        assert getattr(pilot.components, name) == pytest.approx(max(0.0, getattr(hand, name)), rel=1e-6), name
    # and near the components simulated (the residual and the prompts on thousands of cells, within 25%)
    assert pilot.components.residual == pytest.approx(TRUE.residual, rel=0.1)
    assert pilot.components.prompt == pytest.approx(TRUE.prompt, rel=0.25)


def test_the_plan_command_prints_and_writes_the_detectable_difference_beside_the_margin(tmp_path, capsys):
    simulated_sweep(tmp_path / "pilot")
    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text(yaml.safe_dump({
        "eval": {"num_prompts": 400}, "comparison": {**block(["fixed", "ema", "none"], primary=["ema"],
                                                             seeds=[0, 1, 2, 3, 4]), "equivalence_margin": 0.05},
        "hydra": {"sweeper": {"params": {"sft.seed": "0,1,2", "training.seed": "0,1,2,3,4"}}}}))
    out = tmp_path / "exp.plan.md"
    assert main(["--plan", str(exp_file), "--pilot", str(tmp_path / "pilot"), "--out", str(out)]) == 0
    text = out.read_text()
    assert capsys.readouterr().out.startswith(text)
    exp = read_experiment(str(exp_file))
    assert (exp.starts, exp.seeds, exp.prompts, exp.primary) == (3, 5, 400, ["ema"])
    mdd, se, df = design_detectable_difference(from_sweep(tmp_path / "pilot").components,
                                               design_of(exp, read_pilot(tmp_path / "pilot"), 0.05))
    assert df == 2 and f"**±{mdd:.3f}** (margin: ±0.05)" in text
    assert "- units: 3 SFT starts × 5 seeds per start × 400 prompts (eval.num_prompts in the experiment file)" in text
    assert f"| between seeds of a start (seed × arm) | {from_sweep(tmp_path / 'pilot').components.seed:.3g} |" in text


def test_a_pilot_read_on_another_metric_is_named_in_the_plan_and_a_bad_one_refused(tmp_path, capsys):
    """--pilot-metric reads the pilot's differences on a metric other than the design's (a design on eval/gold
    whose pilot compared eval/accuracy): the plan's command line and notes say so; a metric the report does not
    compare per prompt is argparse's one error."""
    simulated_sweep(tmp_path / "pilot")
    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text(yaml.safe_dump({"comparison": {**block(["fixed", "ema"], primary=["ema"], seeds=[0, 1, 2]),
                                                       "metric": "eval/gold"}}))
    assert main(["--plan", str(exp_file), "--pilot", str(tmp_path / "pilot"), "--pilot-metric", "eval/accuracy"]) == 0
    text = capsys.readouterr().out
    assert f"--pilot {tmp_path / 'pilot'} --pilot-metric eval/accuracy`" in text
    assert "the components are the pilot's eval/accuracy differences (--pilot-metric), standing in for the design's " \
           "eval/gold" in text
    with pytest.raises(SystemExit):
        main(["--plan", str(exp_file), "--pilot", str(tmp_path / "pilot"), "--pilot-metric", "reward/mean"])
    assert "--pilot-metric reward/mean is invalid" in capsys.readouterr().err


def test_a_frontier_plan_prints_the_matched_family_and_what_it_does_not_model(tmp_path):
    """With comparison.frontier_key the report's matched-drift table is a Holm family of 2 points x every arm other
    than the baseline (not the primary contrasts' family): the plan prints that family's detectable difference, at
    alpha / that size, and says the interpolation's variance is not modelled; without one it prints neither."""
    simulated_sweep(tmp_path / "pilot")
    pilot = read_pilot(tmp_path / "pilot")
    design = {"eval": {"num_prompts": 400},
              "hydra": {"sweeper": {"params": {"sft.seed": "0,1,2", "training.seed": "0,1,2,3,4"}}}}
    comparison = {**block(["fixed", "ema", "periodic_reset", "none"], primary=["ema"], seeds=[0, 1, 2, 3, 4]),
                  "equivalence_margin": 0.05}
    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text(yaml.safe_dump({**design, "comparison": {**comparison, "frontier_key": "algo.beta"}}))
    exp = read_experiment(str(exp_file))
    d = design_of(exp, pilot, 0.05)
    matched = design_detectable_difference(pilot.components, Design(d.starts, d.seeds, d.prompts, 0.05, 6))[0]
    primary = design_detectable_difference(pilot.components, d)[0]
    assert matched > primary  # alpha/6 against the primary family's alpha/1
    text = plan_text(exp, pilot)
    assert "## At matched drift and matched retention" in text
    assert "one Holm family per axis of at most 2 × 3 = 6 comparisons" in text
    assert f"alpha 0.05/6 = 0.008333 under the components above, the smallest difference detected with 80% power " \
           f"is **±{matched:.3f}**" in text
    assert "Not modelled:" in text
    exp_file.write_text(yaml.safe_dump({**design, "comparison": comparison}))
    plain = plan_text(read_experiment(str(exp_file)), pilot)
    assert "matched" not in plain and "Not modelled" not in plain


def test_an_experiment_without_primary_contrasts_is_one_error_line(tmp_path, capsys):
    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text(yaml.safe_dump({"comparison": block(["fixed", "ema"])}))
    assert main(["--plan", str(exp_file), "--pilot", str(ROOT / "docs" / "quickstart" / "summary.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "comparison.primary is empty: expected the one to three arms" in err[0]
    with pytest.raises(SystemExit):
        main(["--plan", str(exp_file)])  # no --pilot: argparse's error


PLANS = sorted((ROOT / "conf" / "experiment").glob("*.plan.md"))


def test_there_are_committed_plans():
    assert {p.name for p in PLANS} >= {"quickstart.plan.md", "compare_refs_grpo.plan.md",
                                       "long_horizon_grpo.plan.md"}


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p.name)
def test_a_committed_plan_is_what_its_experiment_and_pilot_give_now(plan, monkeypatch):
    monkeypatch.chdir(ROOT)
    name, pilot, metric = re.search(r"`refexp-report --plan (\S+) --pilot (\S+?)(?: --pilot-metric (\S+))?`",
                                    plan.read_text()).groups()
    exp = read_experiment(name)
    assert plan.read_text() == full_plan(exp, Path(pilot), metric or exp.metrics[0]), (
        f"{plan} is stale: refexp-report --plan {name} --pilot {pilot}{' --pilot-metric ' + metric if metric else ''} "
        f"--out {plan.relative_to(ROOT)}")
