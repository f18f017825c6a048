"""An analysis is one section file plus one registry line (refexp/report/sections/__init__.py): a toy section
registered here appears in report.md, report.html and summary.json, in the place its registry line puts it."""

from __future__ import annotations

import json

from refexp.report import build_report
from refexp.report import sections as registry
from refexp.report.sections.base import AlgorithmSection, Section
from refexp.report.writing.blocks import Heading, Paragraph, table_of
from tests.helpers.report_sweep import make_sweep


class RunCount(Section):
    """The toy analysis: how many runs each strategy has."""

    name = "run_count"

    def compute(self, sweep):
        counts: dict[str, int] = {}
        for r in sweep.runs:
            counts[r.strategy] = counts.get(r.strategy, 0) + 1
        return counts

    def blocks(self, report) -> list:
        rows = [[s, str(n)] for s, n in report.run_count.items()]
        return [Heading("Runs per strategy"), Paragraph("A toy section.", lead="Toy."),
                table_of(["strategy", "runs"], rows)]

    def summary(self, report) -> dict:
        return {"run_count": report.run_count}


class GroupCount(AlgorithmSection):
    """The toy analysis per algorithm: how many groups it has."""

    name = "group_count"

    def compute(self, sweep, algo):
        return len(sweep.groups[algo])

    def blocks(self, report, algo) -> list:
        return [Paragraph(f"{report.group_count[algo]} groups", lead="Groups.")]

    def summary(self, report, algo) -> dict:
        return {"group_count": report.group_count[algo]}


def test_a_section_registered_in_one_line_appears_in_every_report_file(tmp_path, monkeypatch):
    make_sweep(tmp_path)
    before = [type(s).__name__ for s in registry.SECTIONS].index("NotCounted")
    monkeypatch.setattr(registry, "SECTIONS", [*registry.SECTIONS[:before], RunCount(), *registry.SECTIONS[before:]])
    monkeypatch.setattr(registry, "ALGORITHM_SECTIONS", [*registry.ALGORITHM_SECTIONS, GroupCount()])
    report = build_report(tmp_path)
    strategies = {r.strategy for r in report.runs}
    assert set(report.run_count) == strategies and sum(report.run_count.values()) == len(report.runs)

    md = (tmp_path / "report.md").read_text()
    toy = md.index("## Runs per strategy")
    assert md.index("## DPO") < toy < md.index("## Runs not counted")
    assert "**Toy.** A toy section." in md and "| strategy | runs |" in md
    assert f"**Groups.** {report.group_count['grpo']} groups" in md.split("## DPO")[0]

    page = (tmp_path / "report.html").read_text()
    assert "<h2>Runs per strategy</h2>" in page and "<p><strong>Toy.</strong> A toy section.</p>" in page
    assert "<th>strategy</th><th>runs</th>" in page and "<strong>Groups.</strong>" in page

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["run_count"] == report.run_count
    assert list(summary)[-1] == "run_count"  # after the keys whose order readers know
    assert {a: s["group_count"] for a, s in summary["algos"].items()} == report.group_count


def test_the_registry_lists_every_section_module_once():
    """One file per analysis: every module of sections/ (but the registry and the protocol) holds a section the
    registry lists, and the registry lists each once."""
    from pathlib import Path

    listed = [type(s).__module__ for s in [*registry.SECTIONS, *registry.ALGORITHM_SECTIONS]]
    files = {f"refexp.report.sections.{p.stem}" for p in Path(registry.__file__).parent.glob("*.py")}
    assert len(listed) == len(set(listed))
    assert set(listed) == files - {"refexp.report.sections.__init__", "refexp.report.sections.base"}
