"""The report's head: its title, the sweep and how many runs it holds in each state; summary.json's which code
rendered it, the sweep, the comparison read (declared or exploratory) and what every column means."""

from __future__ import annotations

from refexp.report.reading.reduce import COLUMNS
from refexp.report.sections.base import Section
from refexp.report.writing.blocks import Code, Heading, Paragraph


def counts(report) -> str:
    """"6 runs: 5 completed, 1 failed"."""
    states: dict[str, int] = {}
    for r in report.runs:
        key = "completed" if r.problem is None else r.state
        states[key] = states.get(key, 0) + 1
    parts = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
    return f"{len(report.runs)} runs: {parts}" if report.runs else "no runs found"


class Overview(Section):
    def blocks(self, report) -> list:
        return [Heading(report.title, level=1), Paragraph(("Sweep ", Code(report.shown_dir), f": {counts(report)}."),
                                                          note=True)]

    def summary(self, report) -> dict:
        plan = report.plan
        return {
            **report.rendered,  # read before any file was written (build._build)
            "sweep_dir": report.shown_dir,
            "confidence": 0.95,
            "comparison": {"kind": plan.kind, "declared": plan.block, "baseline": plan.baseline,
                           "alpha": plan.alpha, "equivalence_margin": plan.margin, "metric": plan.metric,
                           "primary": plan.primary, "primary_metrics": plan.primary_metrics,
                           "problem": plan.problem or None, "allow_mixed": plan.allow_mixed,
                           "left_out_of_the_verdict": plan.excluded,
                           "experiment_configs": [c.to_dict() for c in report.configs]},
            "definitions": {c.key: c.doc for c in (*COLUMNS, *report.extra_columns)}
            | {"steps_to_target": "first step with eval/accuracy >= target; mean over seeds that reached it"},
        }
