"""The report's sections, listed once: each analysis is one module here (``base.Section`` or
``base.AlgorithmSection``), and its line below is what puts it into report.md, report.html and summary.json.
``build.py`` computes them in this order; ``writing/render.py`` writes their blocks in this order and names none.
How to add one: ``docs/architecture.md`` ("Add an analysis to the report").
"""

from __future__ import annotations

from refexp.report.sections.algorithms import Algorithms
from refexp.report.sections.comparison import ComparisonTable
from refexp.report.sections.frontier import Frontier
from refexp.report.sections.gao import Gao
from refexp.report.sections.gold_peak import GoldPeak
from refexp.report.sections.how_to_read import HowToRead
from refexp.report.sections.not_counted import NotCounted
from refexp.report.sections.notes import Notes
from refexp.report.sections.overview import Overview
from refexp.report.sections.own_change import OwnChange
from refexp.report.sections.primary import PrimaryContrasts
from refexp.report.sections.samples import Samples
from refexp.report.sections.within_start import WithinStart

ALGORITHM_SECTIONS = [ComparisonTable(), OwnChange(), GoldPeak(), WithinStart()]
"""Under each algorithm's heading, top to bottom (``Algorithms`` writes them); summary.json's ``algos.<algo>``."""

SECTIONS = [Overview(), PrimaryContrasts(), Algorithms(), Frontier(), Gao(), Samples(), NotCounted(), Notes(),
            HowToRead()]
"""The report, top to bottom."""

SUMMARY_KEYS = ("report_version", "rendered_by_commit", "sweep_dir", "confidence", "comparison", "definitions",
                "primary_contrasts", "algos", "not_counted", "plots", "notes", "frontier", "gao")
"""summary.json's top-level keys in the order its readers have always seen (not the page's); a section's other keys
follow them, in page order."""
