"""refexp.report on a synthetic sweep with known numbers (written by tests/helpers/report_sweep.py).

The sweep (module-scoped, built once; the report is rebuilt where a test needs its own copy):
GRPO  fixed ×3 seeds, periodic_reset reset_every=20 ×3, periodic_reset reset_every=50 ×1,
      ema ×5 seeds, kl_triggered: one failed run (traceback) + one killed run (no status.json,
      half-written last metrics line);
DPO   fixed ×2, none ×2, nested one level deeper (dpo/0, dpo/1, ...).
Every expected number is recomputed here from the rows the test wrote, with numpy.
"""

from __future__ import annotations

import json
import math
import re
import shutil

import numpy as np
import pytest
import yaml

from refexp.record.status import read_status
from refexp.report import build_report, format_table, t_quantile
from refexp.report.__main__ import main
from refexp.report.reading.group import group_runs
from refexp.report.reading.load import load_sweep
from refexp.report.sections.comparison import flags
from refexp.report.statistics.stats import mean_ci, t_cdf
from refexp.report.statistics.summary import summarize
from refexp.report.writing.table import header_and_cells
from tests.helpers.report_sweep import FAILED_DIR, KILLED_DIR, STEPS, dpo_rows, grpo_rows, make_sweep, write_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    expected = make_sweep(root)
    return root, expected, build_report(root, baseline="fixed")


def _col(rows_per_seed, key):
    return [[r[key] for r in rows if key in r] for rows in rows_per_seed]


def _row(report, algo, label):
    (row,) = [r for r in report.tables[algo].rows if r.group.label == label]
    return row


# ---------------------------------------------------------------- t quantile
@pytest.mark.parametrize("df, t", [(1, 12.706), (2, 4.303), (4, 2.776), (10, 2.228), (30, 2.042)])
def test_t_quantile_matches_table(df, t):
    assert t_quantile(0.975, df) == pytest.approx(t, abs=5e-4)


def test_t_quantile_properties():
    assert t_quantile(0.975, 1e7) == pytest.approx(1.95996, abs=1e-4)  # -> normal
    assert t_quantile(0.025, 3) == pytest.approx(-t_quantile(0.975, 3))
    assert t_quantile(0.995, 2) == pytest.approx(9.925, abs=5e-4)
    assert t_cdf(0.0, 5) == pytest.approx(0.5)
    assert t_cdf(t_quantile(0.9, 7), 7) == pytest.approx(0.9, abs=1e-9)
    with pytest.raises(ValueError):
        t_quantile(1.0, 3)


def test_mean_ci_n1_has_no_interval():
    est = mean_ci([0.7])
    assert est.mean == 0.7 and est.half_width is None and est.n == 1
    assert mean_ci([None, None]) is None


# ---------------------------------------------------------------- numbers
@pytest.mark.parametrize("label, n, t", [("fixed", 3, 4.303), ("periodic_reset (reference.reset_every=20)", 3, 4.303),
                                         ("ema", 5, 2.776)])
def test_grpo_numbers_equal_direct_computation(sweep, label, n, t):
    _, expected, report = sweep
    runs = expected[("grpo", label)]
    row = _row(report, "grpo", label)
    assert row.n_completed == n

    direct = {
        "acc_final": [a[-1] for a in _col(runs, "eval/accuracy")],
        "acc_best": [max(a) for a in _col(runs, "eval/accuracy")],
        "reward": [np.mean(a[-5:]) for a in _col(runs, "reward/mean")],
        "kl_init": [a[-1] for a in _col(runs, "kl/init")],
        "kl_ref": [np.mean(a[-5:]) for a in _col(runs, "kl/ref")],
        "ref_cost": [sum(r["perf/ref_fwd_s"] for r in rows) / sum(r["perf/step_s"] for r in rows) for rows in runs],
        "peak_rss_mb": [max(a) for a in _col(runs, "mem/peak_rss_mb")],
    }
    for key, values in direct.items():
        est = row.cells[key]
        assert est.n == n
        assert est.mean == pytest.approx(np.mean(values), rel=1e-12), key
        # 95% CI half-width = t_{0.975, n-1} * s / sqrt(n), t checked against the table constant.
        assert est.half_width == pytest.approx(t * np.std(values, ddof=1) / math.sqrt(n), rel=2e-4), key

    # The same numbers reach summary.json.
    summary = json.loads(report.summary_path.read_text())
    (g,) = [g for g in summary["algos"]["grpo"]["groups"] if g["label"] == label]
    assert g["metrics"]["acc_final"]["mean"] == pytest.approx(np.mean(direct["acc_final"]))
    assert g["metrics"]["kl_ref"]["ci95_half_width"] == pytest.approx(row.cells["kl_ref"].half_width)
    assert sorted(g["seeds"]) == list(range(n))


def test_accuracy_intervals_carry_the_evaluations_binomial_noise(tmp_path):
    """N shared held-out prompts: half-width = sqrt((t s/sqrt(n))^2 + (1.96 sqrt(p(1-p)/N))^2); one seed: the
    binomial part alone; N = min(eval.num_prompts, task.num_eval)."""
    finals = {"fixed": [0.50, 0.56, 0.53], "none": [0.70]}
    job = 0
    for strategy, accs in finals.items():
        for seed, acc in enumerate(accs):
            rows = [{"step": 0, "eval/accuracy": 0.4, "reward/mean": 0.1}, {"step": 10, "eval/accuracy": acc,
                                                                           "reward/mean": 0.2}]
            write_run(tmp_path / str(job), algo="grpo", strategy=strategy, seed=seed, rows=rows,
                       overrides=["algo=grpo", f"reference={strategy}", f"training.seed={seed}"],
                       extra_config={"eval": {"num_prompts": 400}, "task": {"num_eval": 200, "eval_path": None}})
            job += 1
    report = build_report(tmp_path, baseline="fixed")
    fixed, none = _row(report, "grpo", "fixed").cells["acc_final"], _row(report, "grpo", "none").cells["acc_final"]
    p, n_prompts = np.mean(finals["fixed"]), 200
    seeds = 4.303 * np.std(finals["fixed"], ddof=1) / math.sqrt(3)
    assert fixed.half_width == pytest.approx(math.hypot(seeds, 1.95996 * math.sqrt(p * (1 - p) / n_prompts)), rel=1e-4)
    assert fixed.eval_prompts == 200 and fixed.std == pytest.approx(np.std(finals["fixed"], ddof=1))
    assert none.n == 1 and none.half_width == pytest.approx(1.95996 * math.sqrt(0.7 * 0.3 / 200), rel=1e-4)
    assert "0.700 ± 0.064 (n=1)" in report.markdown_path.read_text()
    # the seed-only paired difference has no binomial term: both runs of a pair read the same prompts
    assert _row(report, "grpo", "none").paired["acc_final"].seed_t.half_width is None


def test_single_seed_group_shows_n1(sweep):
    _, _, report = sweep
    row = _row(report, "grpo", "periodic_reset (reference.reset_every=50)")
    assert row.n_completed == 1 and row.cells["acc_final"].half_width is None
    assert "(n=1)" in report.markdown_path.read_text()


def test_steps_to_target(sweep, tmp_path):
    root, expected, report = sweep
    # Default: halfway from the start accuracy (0.30 for all) to the best group's mean final accuracy.
    best_final = max(np.mean([_final(rows) for rows in expected[("grpo", label)]])
                     for (algo, label) in expected if algo == "grpo")
    assert report.tables["grpo"].target == pytest.approx(0.30 + 0.5 * (best_final - 0.30))
    assert "halfway" in report.tables["grpo"].target_note

    copy = tmp_path / "s"
    shutil.copytree(root, copy)
    target = 0.55
    rep = build_report(copy, target=target)
    for label in ("fixed", "ema"):
        firsts = []
        for rows in expected[("grpo", label)]:
            hits = [r["step"] for r in rows if "eval/accuracy" in r and r["eval/accuracy"] >= target]
            firsts.append(hits[0] if hits else math.inf)
        t = _row(rep, "grpo", label).to_target
        reached = [s for s in firsts if math.isfinite(s)]
        assert (t.reached, t.n) == (len(reached), len(firsts))
        if reached:
            assert t.estimate.mean == pytest.approx(np.mean(reached))
    never = summarize("grpo", group_runs(rep.runs)["grpo"], target=0.99)
    assert never.rows[0].to_target.reached == 0 and never.rows[0].to_target.n == 3
    assert header_and_cells(never)[1][0][-2] == "never"


# ---------------------------------------------------------------- grouping, problems, DPO
def test_grouping_separates_non_seed_settings(sweep):
    _, _, report = sweep
    labels = [r.group.label for r in report.tables["grpo"].rows]
    assert labels == ["fixed", "periodic_reset (reference.reset_every=20)",
                      "periodic_reset (reference.reset_every=50)", "ema", "kl_triggered"]
    # hydra.* and the seed never make a group; algo and reference= are not repeated in labels.
    assert all("hydra" not in lab and "seed" not in lab for lab in labels)


def test_a_number_spelled_two_ways_is_one_group_and_the_baseline_stays_one(tmp_path):
    """A sweep job rerun by hand records ``training.lr=1e-3`` where its sweeper wrote ``0.001`` (and ``algo.beta=1``
    where it wrote ``1.0``): still one arm, so ``--baseline fixed`` names one group and the table keeps its verdict."""
    spellings = {0: ("0.001", "1.0"), 1: ("1e-3", "1"), 2: ("1.0E-3", "1e0")}
    for job, (strategy, seed) in enumerate((s, seed) for s in ("fixed", "ema") for seed in spellings):
        lr, beta = spellings[seed] if strategy == "fixed" else spellings[0]
        write_run(tmp_path / str(job), algo="grpo", strategy=strategy, seed=seed, rows=grpo_rows(strategy, seed, None),
                  overrides=["algo=grpo", f"reference={strategy}", f"training.lr={lr}", f"algo.beta={beta}",
                             f"training.seed={seed}"])
    table = build_report(tmp_path, baseline="fixed").tables["grpo"]
    assert [(r.group.label, len(r.group.runs)) for r in table.rows] == [("fixed", 3), ("ema", 3)]
    assert "paired against fixed" in table.verdict and "matches 2 groups" not in table.verdict
    assert table.rows[1].paired


def test_groups_across_a_decimal_setting_are_ordered_by_its_value(tmp_path):
    """algo.beta 0.05 < 0.1 < 0.2 < 0.5 < 2 < 10, not by the digits after the point (0.1, 0.2, 0.05, ...)."""
    from tests.helpers.gold_peak_sweeps import write_run as write_gold_run
    curve = [0.5, 0.6, 0.6, 0.6, 0.6]
    for beta in (0.1, 0.2, 10.0, 0.05, 0.5, 2.0):
        write_gold_run(tmp_path, "fixed", beta, 0, test=curve, val=curve, decl={})
    labels = [g.label for g in group_runs(load_sweep(tmp_path))["grpo"]]
    assert labels == [f"fixed (algo.beta={b})" for b in ("0.05", "0.1", "0.2", "0.5", "2", "10")]


def test_at_steps_columns_give_the_accuracy_at_a_step_and_the_gain_after_it(tmp_path):
    """--at-steps 500: acc@500 (the last evaluation at or before 500) and final minus it, per run, then the
    table's interval; a run whose evaluations end before 500 has neither."""
    curves = {"fixed": [[0.5, 0.6, 0.62, 0.61], [0.5, 0.58, 0.6, 0.6]],
              "none": [[0.5, 0.6, 0.7, 0.8], [0.5, 0.62, 0.75, 0.85]]}
    job = 0
    for strategy, runs in curves.items():
        for seed, accs in enumerate(runs):
            rows = [{"step": s, "eval/accuracy": a, "reward/mean": 0.1} for s, a in zip((0, 400, 800, 1000), accs)]
            write_run(tmp_path / str(job), algo="grpo", strategy=strategy, seed=seed, rows=rows,
                       overrides=["algo=grpo", f"reference={strategy}", f"training.seed={seed}"])
            job += 1
    short = [{"step": s, "eval/accuracy": 0.5, "reward/mean": 0.1} for s in (0, 400)]
    write_run(tmp_path / str(job), algo="grpo", strategy="none", seed=2, rows=short,
               overrides=["algo=grpo", "reference=none", "training.seed=2"])
    report = build_report(tmp_path, at_steps=[500])
    none = _row(report, "grpo", "none").cells
    assert none["acc_at_500"].values == (0.6, 0.62)  # step 400's evaluation; the short run has none
    assert none["gain_after_500"].values == pytest.approx((0.2, 0.23)) and none["gain_after_500"].n == 2
    fixed = _row(report, "grpo", "fixed").cells["gain_after_500"]
    assert fixed.mean == pytest.approx(0.015) and fixed.half_width == pytest.approx(
        12.706 * np.std([0.01, 0.02], ddof=1) / math.sqrt(2), rel=1e-3)
    md = report.markdown_path.read_text()
    assert "acc@500" in md and "gain after 500" in md
    assert "gain_after_500" in json.loads(report.summary_path.read_text())["definitions"]
    assert "acc@500" not in build_report(tmp_path).markdown_path.read_text()


def test_best_is_chosen_on_validation_and_reported_on_test(tmp_path):
    """*best acc* is the test accuracy at the evaluation with the highest val/accuracy: raising the test
    accuracy of other evaluations never changes it (the test split selects nothing)."""
    val = {0: 0.5, 100: 0.7, 200: 0.9, 300: 0.6}

    def write(name, test):
        rows = [{"step": s, "eval/accuracy": test[s], "val/accuracy": v, "reward/mean": 0.1} for s, v in val.items()]
        write_run(tmp_path / name / "0", algo="grpo", strategy="fixed", seed=0, rows=rows,
                   overrides=["algo=grpo", "reference=fixed", "training.seed=0"])
        return _row(build_report(tmp_path / name), "grpo", "fixed").cells["acc_best"].mean

    assert write("a", {0: 0.5, 100: 0.6, 200: 0.55, 300: 0.5}) == 0.55  # not the test maximum 0.6
    assert write("b", {0: 0.99, 100: 0.98, 200: 0.55, 300: 0.97}) == 0.55


def test_a_running_run_reports_the_last_step_it_logged(tmp_path):
    """status.json's last_step is written when a run starts (0) and ends; the rows since say more."""
    rows = [{"step": s, "reward/mean": 0.1} for s in range(10)]
    write_run(tmp_path / "0", algo="grpo", strategy="fixed", seed=0, rows=rows, status="running",
               overrides=["algo=grpo", "reference=fixed"])
    status = read_status(tmp_path / "0")
    (tmp_path / "0" / "status.json").write_text(json.dumps({**status, "last_step": 0}))
    (problem,) = build_report(tmp_path).problems
    assert f"last step 9 of {STEPS}" in problem.error


def test_failed_and_incomplete_runs_are_listed(sweep):
    _, _, report = sweep
    problems = {p.name: p for p in report.problems}
    assert set(problems) == {FAILED_DIR, KILLED_DIR}
    assert problems[FAILED_DIR].state == "failed" and "NaN log-probs" in problems[FAILED_DIR].error
    assert problems[KILLED_DIR].state == "incomplete" and "no status.json" in problems[KILLED_DIR].error
    assert "last step 5" in problems[KILLED_DIR].error  # the half-written step-6 line is skipped

    md = report.markdown_path.read_text()
    section = md.split("## Runs not counted")[1]
    assert "RuntimeError: reference forward produced NaN log-probs" in section
    assert "no status.json" in section
    assert "NaN log-probs" in report.html_path.read_text()
    text = format_table(report)
    assert "NaN log-probs" in text and "no status.json" in text
    summary = json.loads(report.summary_path.read_text())
    assert {p["run"]: p["status"] for p in summary["not_counted"]} == {FAILED_DIR: "failed", KILLED_DIR: "incomplete"}
    # The strategy with no completed run still has a row, with no numbers and "0 of 2" seeds.
    row = _row(report, "grpo", "kl_triggered")
    assert row.n_completed == 0 and all(v is None for v in row.cells.values())
    assert "0 of 2" in md


def test_dpo_has_its_own_table(sweep):
    _, expected, report = sweep
    assert set(report.tables) == {"grpo", "dpo"}
    dpo_cols = [c.key for c in report.tables["dpo"].columns]
    grpo_cols = [c.key for c in report.tables["grpo"].columns]
    assert "pref_acc" in dpo_cols and "margin" in dpo_cols and "reward" not in dpo_cols
    assert "reward" in grpo_cols and "pref_acc" not in grpo_cols
    row = _row(report, "dpo", "fixed")
    direct = [np.mean(a[-5:]) for a in _col(expected[("dpo", "fixed")], "rewards/margins")]
    assert row.cells["margin"].mean == pytest.approx(np.mean(direct))
    assert _row(report, "dpo", "none").cells["ref_cost"].mean == 0.0  # no reference forward logged
    md = report.markdown_path.read_text()
    assert "## GRPO" in md and "## DPO" in md


def test_dpo_runs_logged_under_the_old_names_read_like_new_ones(tmp_path):
    """Runs logged before the rename to TRL's names (rewards/accuracy, rewards/margin) give the same columns."""
    old_names = {"rewards/accuracies": "rewards/accuracy", "rewards/margins": "rewards/margin"}
    cells = {}
    for naming in ("old", "new"):
        root = tmp_path / naming
        for seed in (0, 1):
            rows = dpo_rows("fixed", seed)
            if naming == "old":
                rows = [{old_names.get(k, k): v for k, v in r.items()} for r in rows]
            write_run(root / str(seed), algo="dpo", strategy="fixed", seed=seed, overrides=[f"training.seed={seed}"],
                       rows=rows)
        row = _row(build_report(root), "dpo", "fixed")
        cells[naming] = {k: (row.cells[k].mean, row.cells[k].half_width) for k in ("pref_acc", "margin")}
    direct = [np.mean([r["rewards/accuracies"] for r in dpo_rows("fixed", seed)][-5:]) for seed in (0, 1)]
    assert cells["new"]["pref_acc"][0] == pytest.approx(np.mean(direct))
    assert cells["old"] == cells["new"]


# ---------------------------------------------------------------- files
def test_every_plot_is_a_png(sweep):
    root, _, report = sweep
    for algo in ("grpo", "dpo"):
        assert set(report.plots[algo]) == {"reward", "accuracy", "frontier", "kl_ref", "ref_cost"}
        for path in report.plots[algo].values():
            data = path.read_bytes()
            assert data[:8] == PNG_MAGIC and len(data) > 1000
            assert path.parent == root / "report_plots"
    md = report.markdown_path.read_text()
    for rel in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md):
        assert (root / rel).is_file()  # embedded by a relative path that resolves
    assert len(re.findall(r"!\[", md)) == 10


def test_html_is_self_contained(sweep):
    _, _, report = sweep
    html = report.html_path.read_text()
    srcs = re.findall(r'src="([^"]*)"', html)
    assert len(srcs) == 10 and all(s.startswith("data:image/png;base64,") for s in srcs)
    for bad in ("http://", "https://", "<script", "<link", "url("):
        assert bad not in html
    assert "How to read this" in html and "<table" in html


def test_rerun_and_partial_sweep(sweep, tmp_path):
    root, _, _ = sweep
    copy = tmp_path / "s"
    shutil.copytree(root, copy)
    first = build_report(copy)
    summary = copy.joinpath("summary.json").read_text()
    md = copy.joinpath("report.md").read_text()
    second = build_report(copy)  # our own outputs are not mistaken for runs
    assert copy.joinpath("summary.json").read_text() == summary and copy.joinpath("report.md").read_text() == md
    assert len(second.runs) == len(first.runs) == 18

    # The killed run is resumed and finishes: the next report counts it.
    killed = copy / KILLED_DIR
    rows = grpo_rows("kl_triggered", 1, None)
    killed.joinpath("metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    killed.joinpath("status.json").write_text(json.dumps({"status": "completed", "error": None, "algo": "grpo",
                                                          "reference": "kl_triggered", "seed": 1}))
    third = build_report(copy)
    assert [p.name for p in third.problems] == [FAILED_DIR]
    assert _row(third, "grpo", "kl_triggered").n_completed == 1


def test_single_run_dir_and_empty_dir(sweep, tmp_path):
    root, _, _ = sweep
    one = tmp_path / "one"
    shutil.copytree(root / "0", one)
    rep = build_report(one)
    assert [r.name for r in rep.runs] == ["."] and rep.tables["grpo"].rows[0].n_completed == 1


def test_a_dir_without_runs_exits_2_and_leaves_an_existing_report_untouched(sweep, tmp_path, capsys):
    from refexp.report.build import NoRunsError

    empty = tmp_path / "empty"
    (empty / "report_plots").mkdir(parents=True)
    (empty / "report.md").write_text("an earlier report")
    (empty / "report_plots" / "grpo_reward.png").write_bytes(PNG_MAGIC)
    with pytest.raises(NoRunsError, match="no runs found"):
        build_report(empty)
    assert main([str(empty)]) == 2
    assert "no runs found" in capsys.readouterr().err
    assert (empty / "report.md").read_text() == "an earlier report"
    assert (empty / "report_plots" / "grpo_reward.png").read_bytes() == PNG_MAGIC
    assert not (empty / "report.html").exists() and not (empty / "summary.json").exists()


# ---------------------------------------------------------------- CLI and W&B
def test_cli(sweep, tmp_path, capsys):
    root, _, _ = sweep
    copy = tmp_path / "s"
    shutil.copytree(root, copy)
    assert main([str(copy), "--target", "0.5", "--baseline", "fixed"]) == 0
    out = capsys.readouterr().out
    assert "GRPO" in out and "DPO" in out and "periodic_reset (reference.reset_every=20)" in out
    assert "acc≥0.5" in out and str(copy / "report.md") in out
    assert main([str(copy), "--quiet", "--baseline", "fixed"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "report.md" in out
    with pytest.raises(SystemExit):
        main([str(copy), "--target", "7"])


def test_wandb_failure_never_breaks_the_report(sweep, monkeypatch):
    import sys
    import types

    from refexp.report.writing.wandb_table import _rows, log_to_wandb

    _, _, report = sweep

    def boom(**kw):
        raise RuntimeError("no network")

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(run=None, init=boom))
    assert log_to_wandb(report, start_run=True) is False
    assert log_to_wandb(report) is False  # no active run and not asked to start one

    logged = {}
    fake_run = types.SimpleNamespace(log=logged.update)
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(run=fake_run, Table=lambda **kw: kw,
                                                                     Image=lambda path: path))
    assert log_to_wandb(report) is True
    assert logged["report/grpo_accuracy"] == str(report.plots["grpo"]["accuracy"])  # the plots go too
    columns, data = _rows(report)
    assert logged["report/table"]["columns"] == columns and len(data) == 7


def _preference_rows(strategy: str, seed: int) -> list[dict]:
    """A ``task=preference`` DPO run: held-out pair metrics on the eval schedule, no ``eval/accuracy``."""
    rows = dpo_rows(strategy, seed)
    for row in rows:
        if row.pop("eval/accuracy", None) is not None:
            row["eval/pref_accuracy"] = 0.5 + 0.02 * row["step"] + 0.01 * seed
            row["eval/pref_margin"] = 0.1 * row["step"] + 0.01 * seed
    return rows


def test_runs_without_task_accuracy_show_heldout_pair_columns(tmp_path, capsys):
    expected = {}
    for i, (strategy, seed) in enumerate([("fixed", 0), ("fixed", 1), ("none", 0)]):
        rows = _preference_rows(strategy, seed)
        write_run(tmp_path / str(i), algo="dpo", strategy=strategy, seed=seed, rows=rows,
                   overrides=["algo=dpo", "task=preference", f"reference={strategy}", f"training.seed={seed}"])
        expected.setdefault(strategy, []).append(rows)
    report = build_report(tmp_path)
    table = report.tables["dpo"]
    cols = [c.key for c in table.columns]
    assert {"heldout_pref_final", "heldout_pref_best", "heldout_margin"} <= set(cols)
    assert "acc_final" not in cols and "acc_best" not in cols and table.target is None
    row = _row(report, "dpo", "fixed")
    pref = _col(expected["fixed"], "eval/pref_accuracy")
    assert row.cells["heldout_pref_final"].mean == pytest.approx(np.mean([a[-1] for a in pref]))
    assert row.cells["heldout_pref_best"].mean == pytest.approx(np.mean([max(a) for a in pref]))
    assert row.to_target is None
    header, _ = header_and_cells(table)
    assert "final held-out pref acc" in header and not any(h.startswith("steps to") for h in header)
    assert set(report.plots["dpo"]) == {"reward", "accuracy", "frontier", "kl_ref", "ref_cost"}
    md = report.markdown_path.read_text()
    assert "final held-out pref acc" in md and "No held-out accuracy" in md
    summary = json.loads(report.summary_path.read_text())
    assert summary["algos"]["dpo"]["groups"][0]["metrics"]["acc_final"] is None
    assert "final held-out pref acc" in format_table(report)


# ---------------------------------------------------------------- paired differences and the verdict
def _final(rows, key="eval/accuracy"):
    return [r[key] for r in rows if key in r][-1]


def test_paired_difference_against_the_baseline_equals_the_per_seed_differences(sweep):
    """Runs without eval_outcomes.jsonl: the seed-only t interval over the per-seed differences, labelled so."""
    root, expected, report = sweep
    table = report.tables["grpo"]
    assert table.baseline == "fixed" and table.headline.key == "acc_final"
    base = {seed: _final(rows) for seed, rows in enumerate(expected[("grpo", "fixed")])}
    for label in ("periodic_reset (reference.reset_every=20)", "ema"):
        rows_per_seed = expected[("grpo", label)]
        # ema has seeds 0..4, fixed 0..2: only the common seeds pair
        diffs = [_final(rows) - base[seed] for seed, rows in enumerate(rows_per_seed) if seed in base]
        c = _row(report, "grpo", label).paired["acc_final"]
        assert c.seeds == [0, 1, 2] and c.seed_t.n == 3 and c.seed_only
        assert c.seed_t.mean == pytest.approx(np.mean(diffs), abs=1e-12)
        half = t_quantile(0.975, 2) * np.std(diffs, ddof=1) / math.sqrt(3)
        assert c.seed_t.half_width == pytest.approx(half, abs=1e-12)
        # the verdict's interval: simultaneous (Bonferroni) over the family of the 2 comparisons with a result (the
        # one-seed group and kl_triggered, which completed no run, make no claim)
        v = table.verdicts["acc_final"][label]
        half2 = t_quantile(1 - 0.05 / 2 / 2, 2) * np.std(diffs, ddof=1) / math.sqrt(3)
        assert v.family_size == 2 and v.interval == pytest.approx((np.mean(diffs) - half2, np.mean(diffs) + half2))
    assert _row(report, "grpo", "fixed").paired == {}
    header, body = header_and_cells(table)
    col = header.index("Δ final acc seed-only t 95%")
    assert body[[b[0] for b in body].index("fixed")][col] == "baseline"
    assert body[[b[0] for b in body].index("periodic_reset (reference.reset_every=50)")][col].endswith("(n=1)")
    delta = header.index("Δ final acc vs fixed (paired, simultaneous 97.5%)")
    assert body[[b[0] for b in body].index("ema")][delta].endswith("seed-only")
    assert "seed-only: the prompts' noise is not included" in table.verdict


def test_the_verdict_claims_only_what_the_intervals_support():
    from refexp.report.statistics.paired import Comparison, Endpoint, SeedOnlyResult, judge, verdict_text

    def comparison(label, diffs):
        return Comparison(label, list(range(len(diffs))), SeedOnlyResult(tuple(diffs)) if len(diffs) > 1 else None,
                          mean_ci(diffs), "" if len(diffs) > 1 else "one paired seed and no per-prompt outcomes")

    comparisons = [comparison("up", [0.10, 0.12, 0.11]), comparison("down", [-0.10, -0.12, -0.11]),
                   comparison("noise", [0.2, -0.1, 0.05]), comparison("single", [0.3])]
    verdicts = judge(comparisons, 0.05, None)
    ep = Endpoint("acc_final", "final acc", "final held-out accuracy", lambda r: None, lambda r: None)
    text = verdict_text("grpo", ep, "fixed", "exploratory: not pre-registered", comparisons, verdicts, 0.05)
    assert text.startswith("GRPO, final held-out accuracy, paired against fixed (exploratory: not pre-registered). "
                           "Family: 3 comparisons against fixed, Holm-adjusted, alpha 0.05.")
    assert "up - fixed: +0.110" in text and "higher than fixed." in text
    assert "down - fixed: -0.110" in text and "lower than fixed." in text
    assert "noise - fixed: +0.050" in text and "alpha 0.05): inconclusive." in text
    assert "No claim: single (one paired seed and no per-prompt outcomes)." in text
    assert [verdicts[k].word for k in ("up", "down", "noise")] == ["higher", "lower", "inconclusive"]


def test_a_missing_baseline_is_said_and_another_can_be_chosen(sweep, tmp_path):
    root, _, _ = sweep
    copy = tmp_path / "s"
    shutil.copytree(root, copy)
    rep = build_report(copy, baseline="ema")
    assert rep.tables["grpo"].baseline == "ema" and "paired against ema" in rep.tables["grpo"].verdict
    assert "no 'ema' group" in rep.tables["dpo"].verdict  # DPO has fixed and none only
    summary = json.loads((copy / "summary.json").read_text())
    assert summary["algos"]["grpo"]["baseline"] == "ema"
    fixed = next(g for g in summary["algos"]["grpo"]["groups"] if g["label"] == "fixed")
    assert fixed["paired_vs_baseline"]["acc_final"]["seeds"] == [0, 1, 2]


def test_the_report_shows_a_setup_block_and_no_absolute_path(sweep, tmp_path, monkeypatch):
    root, _, _ = sweep
    copy = tmp_path / "repo" / "docs" / "s"
    shutil.copytree(root, copy)
    monkeypatch.chdir(tmp_path / "repo")
    rep = build_report(copy, baseline="fixed")
    md = (copy / "report.md").read_text()
    assert "Sweep `docs/s`" in md and str(tmp_path) not in md
    assert str(tmp_path) not in (copy / "summary.json").read_text()
    setup = dict(rep.setup["grpo"])
    assert setup["seeds"] == "0, 1, 2, 3, 4" and setup["steps"] == str(STEPS)
    assert "**Verdict.** GRPO, final held-out accuracy" in md


def test_dpo_groups_are_named_by_variant(tmp_path):
    """conf/dpo_variant/* runs: the published name of each loss/reference pair, not "none (dpo_variant=orpo)"."""
    variants = [("fixed", "fixed", "sigmoid", 0.0), ("periodic_reset", "periodic_reset", "sigmoid", 0.0),
                ("ema", "ema", "sigmoid", 0.0), ("simpo", "none", "simpo", 0.0), ("orpo", "none", "orpo", 0.0),
                ("rpo", "fixed", "sigmoid", 1.0), ("nll_only", "none", "sft", 0.0)]
    job = 0
    for variant, strategy, loss, nll_weight in variants:
        for seed in (0, 1):
            run = tmp_path / str(job)
            write_run(run, algo="dpo", strategy=strategy, seed=seed,
                       overrides=["algo=dpo", f"+dpo_variant={variant}", f"training.seed={seed}"],
                       rows=dpo_rows(strategy, seed))
            cfg = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
            cfg["algo"].update(loss_type=loss, nll_weight=nll_weight)
            (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
            job += 1
    rep = build_report(tmp_path, baseline="fixed")  # dpo_variant=fixed: not RPO (fixed), no alphabetical pick
    labels = [r.group.label for r in rep.tables["dpo"].rows]
    assert labels == ["DPO (fixed)", "RPO (fixed, nll_weight=1)", "TR-DPO hard (periodic_reset)", "TR-DPO soft (ema)",
                      "NLL only", "ORPO", "SimPO"]
    assert rep.tables["dpo"].baseline == "DPO (fixed)"
    assert "paired against DPO (fixed)" in rep.tables["dpo"].verdict


def test_the_setup_block_names_the_commit_and_versions_a_run_recorded(tmp_path):
    from refexp.record.provenance import provenance

    run = tmp_path / "0"
    write_run(run, algo="grpo", strategy="fixed", seed=0, overrides=["algo=grpo"], rows=grpo_rows("fixed", 0, None))
    status = read_status(run)
    status.update(provenance=provenance(), started=100.0, ended=160.0)
    (run / "status.json").write_text(json.dumps(status))
    setup = dict(build_report(tmp_path).setup["grpo"])
    assert "torch " in setup["versions"] and "python " in setup["versions"]
    assert setup["wall time"] == "1.0 min in 1 runs (1.0 min each)"
    assert setup.get("refexp commit") == provenance()["commit"]  # None outside a git checkout: no row


def test_the_report_shows_what_each_group_wrote(tmp_path):
    for job, strategy in enumerate(("fixed", "ema")):
        run = tmp_path / str(job)
        write_run(run, algo="grpo", strategy=strategy, seed=0, overrides=["algo=grpo", f"reference={strategy}"],
                   rows=grpo_rows(strategy, 0, None))
        with open(run / "samples.jsonl", "w") as f:
            for step in (0, 40):
                for i in range(4):
                    f.write(json.dumps({"step": step, "kind": "eval", "prompt": f"{i}+{i}=",
                                        "completion": f"{strategy}-{step}-{i}", "answer": str(2 * i),
                                        "reward": 1.0}) + "\n")
    build_report(tmp_path)
    md = (tmp_path / "report.md").read_text()
    section = md.split("## What the models wrote")[1].split("## Runs not counted")[0]
    assert "| grpo | fixed | 0 | 0+0= | fixed-40-0 | 0 | 1 |" in section
    assert "ema-40-2" in section and "ema-40-3" not in section and "-0-" not in section  # final eval, 3 each
    assert "What the models wrote" in (tmp_path / "report.html").read_text()


def test_a_falling_chosen_log_prob_is_flagged_as_likelihood_displacement(tmp_path):
    runs = [("fixed", -3.0), ("fixed", -2.8), ("fixed", -3.2), ("none", 0.4), ("none", 0.6), ("none", 0.5),
            ("ema", -2.0), ("ema", 1.0), ("ema", -0.5)]  # ema: below 0 on average, the interval includes 0
    for job, (strategy, drift) in enumerate(runs):
        rows = dpo_rows(strategy, job)
        for r in rows:
            if "eval/accuracy" in r:
                r["logps/chosen_delta"] = drift * r["step"] / 20
        write_run(tmp_path / str(job), algo="dpo", strategy=strategy, seed=job % 3,
                   overrides=["algo=dpo", f"reference={strategy}", f"training.seed={job % 3}"], rows=rows)
    table = build_report(tmp_path).tables["dpo"]
    (flag,) = flags(table)
    assert flag.startswith("Likelihood displacement: the chosen completions' log-prob fell below its start in fixed (")
    assert "none" not in flag and "ema" not in flag  # rose; fell on average without an interval below 0
    assert "**Flag.** Likelihood displacement" in (tmp_path / "report.md").read_text()


def test_best_accuracy_is_selected_on_validation_and_read_on_the_test_prompts(tmp_path):
    from refexp.report.reading.reduce import best_on_validation

    rows = grpo_rows("fixed", 0, None)
    evals = [r for r in rows if "eval/accuracy" in r]
    for r, val in zip(evals, [0.1, 0.5, 0.9, 0.7, 0.2]):
        r["val/accuracy"] = val
    write_run(tmp_path / "0", algo="grpo", strategy="fixed", seed=0, overrides=["algo=grpo"], rows=rows)
    run = build_report(tmp_path).runs[0]
    assert best_on_validation(run) == evals[2]["eval/accuracy"]  # step 20: the best validation accuracy
    assert best_on_validation(run) != max(r["eval/accuracy"] for r in evals)  # not the test maximum
    for r in rows:
        r.pop("val/accuracy", None)
    write_run(tmp_path / "1", algo="grpo", strategy="fixed", seed=1, overrides=["algo=grpo"], rows=rows)
    no_val = [r for r in build_report(tmp_path).runs if r.name == "1"][0]
    assert best_on_validation(no_val) == max(r["eval/accuracy"] for r in evals)


def _write_objective_run(run, strategy: str, objective: str, seed: int = 0) -> None:
    write_run(run, algo="grpo", strategy=strategy, seed=seed,
              overrides=["algo=grpo", f"reference={strategy}", f"algo.objective={objective}", f"training.seed={seed}"],
              rows=grpo_rows("fixed", seed, None), extra_config={"algo": {"name": "grpo", "objective": objective}})


def test_the_continued_sft_baseline_is_named_and_paired_like_a_strategy(tmp_path):
    for job, (strategy, objective) in enumerate([("fixed", "grpo"), ("none", "continued_sft")]):
        _write_objective_run(tmp_path / str(job), strategy, objective)
    table = build_report(tmp_path, baseline="fixed").tables["grpo"]
    assert [r.group.label for r in table.rows] == ["fixed", "continued_sft"]
    assert table.rows[1].paired and "continued_sft" in table.verdict


def test_a_run_recorded_as_objective_sft_reads_as_continued_sft(tmp_path):
    """Runs recorded before the rename say ``algo.objective: sft`` (config and overrides): they group with the
    runs that say ``continued_sft`` and take its label (refexp/choices.py: RENAMED_CHOICES)."""
    from refexp.record.resolved_config import write_resolved_config

    _write_objective_run(tmp_path / "0", "none", "sft", seed=0)
    write_resolved_config(tmp_path / "0", {"algo": {"name": "grpo", "objective": "sft"}, "reference": {"name": "none"},
                                           "training": {"seed": 0, "steps": STEPS}})
    _write_objective_run(tmp_path / "1", "none", "sft", seed=1)  # .hydra/config.yaml only
    _write_objective_run(tmp_path / "2", "none", "continued_sft", seed=2)
    runs = load_sweep(tmp_path)
    assert [r.objective for r in runs] == ["continued_sft"] * 3
    [group] = group_runs(runs)["grpo"]
    assert group.label == "continued_sft" and len(group.runs) == 3


def test_gold_and_proxy_are_drawn_against_kl_init_when_runs_log_a_gold_reward(tmp_path):
    """Runs of a learned reward log eval/gold: the report adds the gold/proxy-vs-kl/init plot, whose points are the
    seed means at the evaluations every seed logged (hand-computed here); runs without it get no such plot."""
    from refexp.report.writing.plots import gold_proxy_curve

    gold = {0: [0.3, 0.5, 0.4], 1: [0.3, 0.6, 0.2]}  # per seed, at steps 0, 10, 20
    for seed in (0, 1):
        rows = [{"step": s, "reward/mean": 0.1 * s, "reward/gold": gold[seed][i], "eval/accuracy": 1.0 + s + seed,
                 "eval/gold": gold[seed][i], "kl/init": 0.01 * s * (seed + 1)} for i, s in enumerate((0, 10, 20))]
        rows.append({"step": 25, "eval/gold": 9.0})  # a step without kl/init and proxy: not a point
        write_run(tmp_path / str(seed), algo="grpo", strategy="none", seed=seed,
                   overrides=["algo=grpo", "reference=none", f"training.seed={seed}"], rows=rows)
    kl, g, proxy = gold_proxy_curve(load_sweep(tmp_path))
    np.testing.assert_allclose(kl, [0.0, 0.15, 0.30])
    np.testing.assert_allclose(g, [0.3, 0.55, 0.3])
    np.testing.assert_allclose(proxy, [1.5, 11.5, 21.5])
    report = build_report(tmp_path, baseline="none")
    assert report.plots["grpo"]["gold"].read_bytes()[:8] == PNG_MAGIC
    assert "Gold and proxy reward vs drift from init" in report.markdown_path.read_text()


def test_no_gold_plot_without_a_gold_reward(sweep):
    _, _, report = sweep
    assert "gold" not in report.plots["grpo"]


def test_the_setup_block_says_a_pretrained_checkpoint_replaced_the_flavors_shapes():
    """model=smollm2_135m keeps model.flavor's default (debugmodel) while its shapes come from the checkpoint's
    config.json: the setup block must not present the run as the debug model."""
    from types import SimpleNamespace

    from refexp.report.reading.setup import _value

    pretrained = SimpleNamespace(config={"model": {
        "name": "llama3", "flavor": "debugmodel", "pretrained": "smollm2_135m",
        "hf_assets_path": "/cache/pretrained/smollm2_135m-abc-v1"}})
    assert _value(pretrained, "model.flavor") == "debugmodel, its shapes replaced by the checkpoint's config.json"
    assert _value(pretrained, "model.pretrained") == "smollm2_135m"
    assert _value(SimpleNamespace(config={"model": {"flavor": "debugmodel"}}), "model.flavor") == "debugmodel"
