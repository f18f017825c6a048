"""The runs left out of every number (failed, unfinished, unreadable), each with its error."""

from __future__ import annotations

from refexp.report.sections.base import Section
from refexp.report.writing.blocks import Heading, Paragraph, table_of
from refexp.report.writing.table import error_cell

HEADER = ["run", "algo", "group", "status", "error"]


class NotCounted(Section):
    def blocks(self, report) -> list:
        if not report.problems:
            return [Heading("Runs not counted"), Paragraph("None: every run found completed.")]
        rows = [[p.name, p.algo, p.label, p.state, error_cell(p.error)] for p in report.problems]
        return [Heading("Runs not counted"), table_of(HEADER, rows, numeric=False, words=True)]

    def summary(self, report) -> dict:
        return {"not_counted": [{"run": p.name, "algo": p.algo, "strategy": p.strategy, "label": p.label,
                                 "status": p.state, "error": p.error} for p in report.problems]}

