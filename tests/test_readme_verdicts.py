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
        elif word in ("higher", "lower") and interval_text(cell.interval) not in before and "uninformative" not in before:
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
