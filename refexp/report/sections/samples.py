"""What the models wrote: the first held-out prompts' greedy completions at each group's final evaluation."""

from __future__ import annotations

from refexp.report.sections.base import Section
from refexp.report.writing.blocks import Heading, Paragraph, table_of

HEADER = ["algo", "group", "run", "prompt", "completion", "answer", "reward"]


def _short(text, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def sample_rows(report, k: int = 3) -> list[list[str]]:
    """Up to ``k`` final-evaluation samples of each group's first completed run."""
    rows = []
    for algo, t in report.tables.items():
        for row in t.rows:
            run = row.group.completed[0] if row.group.completed else None
            for sample in (run.final_samples(k=k) if run is not None else []):
                rows.append([algo, row.group.label, run.name, _short(sample.get("prompt", "")),
                             _short(sample.get("completion", "")), _short(sample.get("answer", "")),
                             _reward_cell(sample.get("reward", float("nan")))])
    return rows


def _reward_cell(reward) -> str:
    """A sample's reward: a number to 3 significant digits; anything else (a hand-edited or foreign samples.jsonl)
    as written, said to be no number."""
    if isinstance(reward, (int, float)):
        return f"{reward:.3g}"
    return f"{_short(reward, 40)} (not a number)"


class Samples(Section):
    def blocks(self, report) -> list:
        rows = sample_rows(report)
        if not rows:
            return []
        return [Heading("What the models wrote"),
                Paragraph("The first held-out prompts' greedy completions at each group's final evaluation (its first "
                          "completed seed; all of them in the run's `samples.jsonl`).", in_html=False),
                table_of(HEADER, rows, numeric=False, words=True)]
