"""The protocol every analysis of a report follows: compute a result from the sweep, then say it as blocks
(``writing/blocks.py``) and as its part of summary.json. ``refexp/report/sections/__init__.py`` lists the sections
once; ``build.py`` computes them and ``writing/render.py`` writes them, neither naming any.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from refexp.report.reading.comparison_plan import ComparisonPlan
from refexp.report.reading.group import Group
from refexp.report.reading.load import Run
from refexp.report.statistics.summary import AlgoTable
from refexp.report.writing.blocks import Block


@dataclass(frozen=True)
class Sweep:
    """What a section computes from: the runs, the comparison they are read under, each algorithm's groups and
    comparison table, and where plots go."""

    runs: list[Run]
    plan: ComparisonPlan
    groups: dict[str, list[Group]]
    """algo -> its groups (every algorithm found, with or without a completed run)."""
    tables: dict[str, AlgoTable]
    """algo -> its comparison table (the algorithms with a completed run: the report's algorithms)."""
    plots_dir: Path
    target: Optional[float] = None
    """``--target`` as asked (None: each table's default)."""
    extra_columns: tuple = field(default=())


class Section:
    """One analysis of the whole sweep. ``name``: where its result is kept (``report.<name>``; "" keeps none).

    ``compute`` runs once, while the report is built (None: nothing to say, and its blocks say nothing); ``after``
    once all have computed; ``blocks`` and ``summary`` read the built report, so they may use other sections' results
    too."""

    name: str = ""

    def compute(self, sweep: Sweep) -> Any:
        return None

    def after(self, report, sweep: Sweep) -> Any:
        """What it computes from other sections' results: run once every section's ``compute`` has, before anything
        is written (the first screen's plot of the primary contrasts, which the frontier section tests); kept as
        ``report.<name>`` in place of ``compute``'s result, unless None."""
        return None

    def setup_rows(self, result: Any, algo: str, sweep: Sweep) -> list[tuple[str, str]]:
        """Rows this analysis adds to ``algo``'s setup block (what the runs were: e.g. the settings it chose)."""
        return []

    def blocks(self, report) -> list[Block]:
        return []

    def summary(self, report) -> dict:
        """Its top-level entries of summary.json."""
        return {}


class AlgorithmSection:
    """One analysis per algorithm, written under the algorithm's heading, its summary.json part under
    ``algos.<algo>``. ``report.<name>`` is algo -> result, for the algorithms whose result is not empty."""

    name: str = ""

    def compute(self, sweep: Sweep, algo: str) -> Any:
        return None

    def blocks(self, report, algo: str) -> list[Block]:
        return []

    def summary(self, report, algo: str) -> dict:
        return {}
