"""Each algorithm's part of the report: its heading, then every per-algorithm section (``ALGORITHM_SECTIONS`` in
``sections/__init__.py``) in turn; summary.json's ``algos`` (algo -> every per-algorithm section's entries) and
``plots`` (algo -> its plots' paths)."""

from __future__ import annotations

from refexp.report.sections.base import Section
from refexp.report.writing.blocks import Heading


class Algorithms(Section):
    def blocks(self, report) -> list:
        out = []
        for algo in report.tables:
            out.append(Heading(algo.upper()))
            for s in report.algorithm_sections:
                out += s.blocks(report, algo)
        return out

    def summary(self, report) -> dict:
        algos = {}
        for algo in report.tables:
            algos[algo] = {}
            for s in report.algorithm_sections:
                algos[algo] |= s.summary(report, algo)
        return {"algos": algos, "plots": {a: {k: p.relative_to(report.sweep_dir).as_posix() for k, p in ps.items()}
                                          for a, ps in report.plots.items()}}
