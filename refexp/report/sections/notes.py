"""The report's notes: what reading the runs met on the way (groups merged, unreadable lines skipped)."""

from __future__ import annotations

from refexp.report.sections.base import Section
from refexp.report.writing.blocks import BulletList, Heading


class Notes(Section):
    def blocks(self, report) -> list:
        return [Heading("Notes", joined=True), BulletList(tuple(report.notes))] if report.notes else []

    def summary(self, report) -> dict:
        return {"notes": report.notes}
