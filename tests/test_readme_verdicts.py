"""The README's and docs/findings.md's verdict words are the verdicts the current rule gives the cells they cite.

Each cited cell carries a marker (``tests/helpers/committed_cells.py``); the verdict word written just before it
must be what ``refexp.report.statistics.inference``'s rule decides for that committed ``summary.json`` cell, and an
"inconclusive (interval [a, b])" must quote the cell's interval."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers.committed_cells import MARKER, interval_text, phrase_before, resolve

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "docs" / "findings.md"]


def claims(text: str):
    """(the verdict word the text uses, the marker's kind and spec, the text before it with line breaks as spaces)."""
    for m in MARKER.finditer(text):
        yield phrase_before(text, m.start()), m.group(1), m.group(2), " ".join(text[:m.start()][-300:].split())


def check(text: str) -> list[str]:
    """One line per claim whose word is not the rule's, or that does not quote the cell's interval (an interval past
    ±1 on a proportion is quoted as uninformative)."""
    wrong = []
    for word, kind, spec, before in claims(text):
        cell = resolve(kind, spec)
        if word != cell.decided:
            wrong.append(f"{cell.where}: the text says {word!r}, the rule decides {cell.decided!r}")
        elif word == "inconclusive" and interval_text(cell.interval) not in before:
            wrong.append(f"{cell.where}: inconclusive must quote the interval {interval_text(cell.interval)}")
        elif (word in ("higher", "lower") and interval_text(cell.interval) not in before
              and "uninformative" not in before):
            wrong.append(f"{cell.where}: {word} must quote the interval {interval_text(cell.interval)} (or call it "
                         f"uninformative)")
    return wrong


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_cited_verdict_is_the_rules(page):
    text = page.read_text()
    assert MARKER.search(text), f"{page.name} cites no summary cell"
    assert check(text) == []


def test_the_findings_cite_every_report_they_quote():
    text = (ROOT / "docs" / "findings.md").read_text()
    folders = {re.split(r"\s*\|\s*", spec)[0] for _, _, spec, _ in claims(text)}
    assert {"frontier_grpo", "frontier_grpo/paired_against_none", "frontier_grpo_extended", "long_horizon_grpo",
            "tuned_dpo"} <= folders


def test_a_higher_for_an_inconclusive_cell_fails():
    # long horizon, start 0: reset-500 - fixed +0.130 [-0.075, +0.335], Holm p 1 -> inconclusive.
    marker = ("<!-- paired long_horizon_grpo | grpo | 833dc3b20540ad92 | periodic_reset (every 500) | "
              "acc_final -->")
    assert check(f"ends +0.130 [−0.075, +0.335] higher{marker} than fixed") != []
    assert check(f"ends +0.130, inconclusive (interval [−0.075, +0.335]){marker}") == []


def test_a_degenerate_t_read_as_higher_fails():
    # The committed report printed 'higher' for fixed beta 0.2 - none (per-seed differences 0.06, 0.06, 0.06).
    marker = ("<!-- paired frontier_grpo/paired_against_none | grpo | 833dc3b20540ad92 | fixed (algo.beta=0.2) | "
              "retention_final -->")
    assert check(f"+0.060 [+0.027, +0.097] higher{marker}") != []
    assert check(f"a degenerate t: no claim{marker}") == []


def test_a_current_reports_primary_and_peak_cells_are_checked_against_their_printed_verdict():
    primary = ("<!-- primary overoptimization_grpo | ema − fixed's frontier | final eval/gold at matched kl/init "
               "0.3 -->")
    assert check(f"+0.102 [+0.050, +0.153] higher{primary}") == []
    assert check(f"+0.102, inconclusive (interval [+0.050, +0.153]){primary}") != []
    assert check(f"+0.102 higher{primary}") != []  # the interval must be quoted
    best = "<!-- best overoptimization_grpo | ema (algo.beta=2.0) -->"
    assert check(f"+0.016 [−0.011, +0.042], equivalent within ±0.05{best}") == []
    assert check(f"+0.016, inconclusive (interval [−0.011, +0.042]){best}") != []
    peak = "<!-- peak overoptimization_grpo | grpo | none -->"
    assert check(f"+0.104 [+0.051, +0.157] lower{peak}") != []


def test_a_primary_contrast_the_report_could_not_test_is_cited_as_no_claim():
    """periodic_reset's declared kl/init 0.3 lay outside its runs (docs/overoptimization_grpo): "no claim" is the
    cell's word; any verdict word for it fails, and "a degenerate t: no claim" stays the degenerate t's phrase."""
    primary = ("<!-- primary overoptimization_grpo | periodic_reset − fixed's frontier | final eval/gold at matched "
               "kl/init 0.3 -->")
    assert check(f"periodic reset makes no claim (its runs ended past 0.3){primary}") == []
    assert check(f"periodic reset is inconclusive{primary}") != []
    assert check(f"periodic reset, a degenerate t: no claim{primary}") != []


def test_a_report_whose_runs_are_not_kept_cannot_be_cited_by_its_printed_verdict():
    # its printed word may be an older rule's: only paired/kept cells, re-decided by the current rule, may be cited
    with pytest.raises(KeyError, match="runs are not kept"):
        check("higher<!-- best overoptimization_grpo_first_design | fixed (algo.beta=1.0) -->")


def test_a_kept_cell_of_a_current_report_reads_its_equivalence():
    # frontier_test's runs are beside it: fixed at beta 5 kept its retention within the declared margin
    kept = "<!-- kept frontier_test | grpo | all | fixed (algo.beta=5.0) -->"
    assert check(f"−0.010 [−0.029, +0.009], equivalent within ±0.05{kept}") == []
    assert check(f"−0.010, inconclusive (interval [−0.029, +0.009]){kept}") != []
