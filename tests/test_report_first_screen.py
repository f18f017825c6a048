"""Where no declared primary contrast can be tested (the quickstart runs one seed), the report leads with what the
runs show: each arm's final accuracy, retention and drift against its start, and the accuracy-vs-drift plot, with
"one seed: no claim" said once; where one can be tested, the first screen is the primary contrasts as before."""

from __future__ import annotations

import json

import numpy as np

from refexp.report import build_report
from refexp.report.writing.cells import cell_text
from tests.helpers.primary_sweeps import PROMPTS, block, flipped, write_run

ARMS = {"fixed": (0, 0), "periodic_reset": (40, 10), "ema": (25, 20)}
"""Prompts each arm wins and loses against fixed's scores."""
DRIFT = {"fixed": 0.02, "periodic_reset": 0.15, "ema": 0.12}


def sweep(root, seeds) -> None:
    """Each arm at ``seeds``, declared with periodic_reset and ema as primary contrasts, logging retention and
    kl/init (0 at step 0)."""
    rng = np.random.default_rng(3)
    decl = block(list(ARMS), primary=["periodic_reset", "ema"], seeds=list(seeds))
    for seed in seeds:
        base = (rng.random(PROMPTS) < 0.5).astype(float)
        for arm, (up, down) in ARMS.items():
            scores = base if arm == "fixed" else flipped(base, up, down, rng)
            run = write_run(root / f"{arm}-{seed}", arm, seed, scores, decl=decl,
                            retention=(rng.random(PROMPTS) < 0.9).astype(float))
            metrics = run / "metrics.jsonl"
            rows = [json.loads(line) for line in metrics.read_text().splitlines()]
            for row in rows:
                row["kl/init"] = DRIFT[arm] if row["step"] else 0.0
            metrics.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_one_seed_leads_with_each_arm_against_its_start_and_says_no_claim_once(tmp_path):
    sweep(tmp_path, seeds=[0])
    report = build_report(tmp_path)
    md = report.markdown_path.read_text()
    first = md.split("\n## ", 2)[1]  # the first section after the title and the counts
    assert first.startswith("Each arm against its start\n\nOne seed: no claim. The declared primary contrasts "
                            "(periodic_reset, ema, each against fixed, on eval/accuracy) need two paired seeds or "
                            "more.")
    assert md.count("One seed: no claim") == 1
    assert "no claim (one paired seed)" not in first and "Method:" not in first and "docs/runs.md" not in first
    assert ("| arm | final accuracy | Δ accuracy from the start | final retention | Δ retention from the start "
            "| drift from the start (kl/init) |") in first
    row = report.tables["grpo"].rows[[r.group.label for r in report.tables["grpo"].rows].index("ema")]
    run = row.group.completed[0]
    final = run.series("eval/accuracy")[1][-1]
    assert (f"| ema | {cell_text(row.cells['acc_final'])} | +{final:.3f} (n=1) | "
            f"{cell_text(row.cells['retention_final'])} | {cell_text(row.cells['retention_change'])} | "
            f"{DRIFT['ema']:.3f} (n=1) |") in first
    assert "![GRPO: Accuracy vs drift from init (kl/init)](report_plots/grpo_frontier.png)" in first

    page = report.html_path.read_text()
    assert page.index("<h2>Each arm against its start</h2>") < page.index("<h2>GRPO</h2>")
    assert "<h2>Primary contrasts</h2>" not in page and page.count("One seed: no claim") == 1
    summary = json.loads(report.summary_path.read_text())  # the lines stay in summary.json, each without a claim
    assert [p["contrast"] for p in summary["primary_contrasts"]] == ["periodic_reset − fixed", "ema − fixed"]
    assert {p["verdict"] for p in summary["primary_contrasts"]} == {"no claim (one paired seed)"}


def test_a_testable_primary_contrast_keeps_the_primary_contrasts_first(tmp_path):
    sweep(tmp_path, seeds=[0, 1])
    md = build_report(tmp_path).markdown_path.read_text()
    first = md.split("\n## ", 2)[1]
    assert first.startswith("Primary contrasts\n") and "Method:" in first
    assert "Each arm against its start" not in md and "One seed: no claim" not in md


def test_only_a_want_of_seeds_replaces_the_primary_contrasts():
    """A primary contrast without a claim for another reason (docs/frontier_test's declared drift that some
    replicates' runs never reached) is a result of the study: its line stays on the first screen."""
    from refexp.report.sections.primary import Line, untestable

    def line(why: str) -> Line:
        return Line("grpo", "ema − fixed", "final held-out accuracy", None, None, None, f"no claim ({why})", None,
                    no_claim=why)

    assert untestable([line("one paired seed"), line("one paired seed")])
    assert not untestable([line("one paired seed"), line("not matched: the declared kl/init 0.065 lies outside")])
    assert not untestable([])  # nothing declared: the first screen says so itself
