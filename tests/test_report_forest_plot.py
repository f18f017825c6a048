"""The first screen's forest plot (refexp/report/writing/forest_plot.py, drawn by sections/primary.py): one row per
primary contrast, its Δ and the interval its verdict is read with against the ±margin band, labelled with its
verdict; a contrast without a claim has its row and no interval. For final-value and for matched-drift primaries."""

from __future__ import annotations

import json

import pytest

from refexp.report import build_report
from refexp.report.sections import primary
from refexp.report.writing.forest_plot import PLOT
from tests.helpers.frontier_sweeps import frontier_sweep
from tests.helpers.primary_sweeps import block
from tests.test_report_first_screen import sweep as final_value_sweep
from tests.test_report_primary import NETS, three_arms

X = 10 ** (1 / 3)
"""A kl/init inside every curve's range of the frontier sweep."""


@pytest.fixture
def drawn(monkeypatch):
    """Every call of the plotting function: (rows, margin), the real plot still drawn."""
    calls = []

    def spy(path, rows, margin):
        calls.append((list(rows), margin))
        return plot(path, rows, margin)

    plot = primary.plot_forest
    monkeypatch.setattr(primary, "plot_forest", spy)
    return calls


def _first_screen(report) -> str:
    return report.markdown_path.read_text().split("\n## ", 2)[1]


def test_final_value_primaries_are_pictured_on_the_first_screen_from_their_verdicts(tmp_path, drawn):
    three_arms(tmp_path, block(["fixed", *NETS], primary=["ema", "periodic_reset"], equivalence_margin=0.1))
    report = build_report(tmp_path)
    (rows, margin), = drawn
    verdicts = report.tables["grpo"].verdicts["acc_final"]
    assert [r.label for r in rows] == ["periodic_reset − fixed\nfinal held-out accuracy",  # the table's order
                                       "ema − fixed\nfinal held-out accuracy"]
    for r, arm in zip(rows, ("periodic_reset", "ema")):
        v = verdicts[arm]
        assert (r.verdict, r.point, r.interval, r.level, r.equivalence) == (
            v.word, v.result.point, tuple(v.interval), 1 - v.alpha / v.family_size, tuple(v.equivalence.interval))
    assert [r.verdict for r in rows] == ["equivalent within ±0.1", "inconclusive"] and margin == 0.1
    assert (tmp_path / "report_plots" / PLOT).stat().st_size > 0
    first = _first_screen(report)
    assert first.startswith("Primary contrasts\n") and f"](report_plots/{PLOT})" in first
    assert "simultaneous (Bonferroni) 97.5% interval" in first  # the levels named in the caption
    assert "equivalence tests' 95% interval" in first and "equivalence margin ±0.1 shaded" in first
    assert first.index(PLOT) < first.index("| contrast |")  # seen before it is read
    assert json.loads(report.summary_path.read_text())["primary_contrasts_plot"] == f"report_plots/{PLOT}"
    assert "data:image/png;base64," in report.html_path.read_text().split("<h2>GRPO</h2>")[0]


def test_a_degenerate_t_is_pictured_as_no_claim_without_interval(tmp_path, drawn):
    final_value_sweep(tmp_path, seeds=[0, 1])  # identical per-seed differences: a degenerate t, no claim
    report = build_report(tmp_path)
    (rows, margin), = drawn
    assert {v.word for v in report.tables["grpo"].verdicts["acc_final"].values()} == {"degenerate t"}
    assert [(r.verdict, r.point, r.interval) for r in rows] == [("degenerate t: no claim", None, None)] * 2
    assert margin is None and "no equivalence margin declared" in _first_screen(report)


def test_matched_primaries_are_pictured_with_the_margin_and_a_no_claim_row_without_interval(tmp_path, drawn):
    """At a declared kl/init of 0.05 no run reached: no claim, a row of words; at X, ema higher, with the
    simultaneous and the equivalence tests' intervals against the ±0.05 band."""
    frontier_sweep(tmp_path, primary=["ema"], matched={"axis": "kl/init", "at": [0.05, X]}, equivalence_margin=0.05)
    report = build_report(tmp_path)
    (rows, margin), = drawn
    m = report.frontier.primary
    assert margin == 0.05 and len(rows) == len(m.rows) == 2
    for r, row in zip(rows, m.rows):
        assert r.label == f"{row.arm} − fixed's frontier\nfinal eval/accuracy at matched kl/init {row.x:.3g}"
        v = m.verdicts.get(row.label)
        if v is None:
            assert (r.verdict, r.point, r.interval, r.equivalence) == ("no claim", None, None, None)
        else:
            assert (r.verdict, r.point, r.interval, r.equivalence, r.equivalence_level) == (
                v.word, v.result.point, tuple(v.interval), tuple(v.equivalence.interval), 1 - 2 * v.equivalence.alpha)
    assert [r.verdict for r in rows] == ["no claim", "higher"]
    first = _first_screen(report)
    assert f"](report_plots/{PLOT})" in first and "equivalence margin ±0.05 shaded" in first
    assert (tmp_path / "report_plots" / PLOT).stat().st_size > 0


def test_one_seed_draws_no_forest_plot(tmp_path, drawn):
    """Where no primary contrast can be tested for want of seeds, the first screen shows the arms against their
    start instead, and there is nothing to picture."""
    final_value_sweep(tmp_path, seeds=[0])
    report = build_report(tmp_path)
    assert drawn == [] and not (tmp_path / "report_plots" / PLOT).exists()
    assert json.loads(report.summary_path.read_text())["primary_contrasts_plot"] is None
