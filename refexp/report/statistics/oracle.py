"""The oracle choice: each arm's setting picked on the test metric itself (the beta whose mean final ``eval/gold``
is best), beside the setting the validation rule (``comparison.select``) chose and what each reached on test.

Choosing on the prompts the number is then read on is what no user of a learned reward can do (they have the proxy,
and at most a small gold-labelled validation budget), and it favours the chosen setting by that split's noise, so
the oracle's number is an upper bound on what tuning could reach, not a result: it is reported apart, labelled so,
and enters no family, no verdict and not the first screen. The gap between the two choices' test means is what
tuning without the oracle gave up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from refexp.report.statistics.selection import Candidate, Selection, best_of, mean_final

TITLE = "Oracle choice (uses the test labels: an upper bound, not a result)"


@dataclass
class OracleRow:
    """One arm: the setting best on test and the validation rule's choice, each with its mean final test value."""

    arm: str
    oracle: Optional[Candidate]
    oracle_test: Optional[float]
    chosen: Optional[Candidate]
    chosen_test: Optional[float]
    tried: int

    @property
    def given_up(self) -> Optional[float]:
        """The oracle's test mean minus the validation choice's (>= 0 when a higher metric is better)."""
        if self.oracle_test is None or self.chosen_test is None:
            return None
        return self.oracle_test - self.chosen_test


@dataclass
class Oracle:
    metric: str
    rows: list[OracleRow]
    notes: list[str] = field(default_factory=list)
    text: str = ""


def oracle_choice(sel: Selection) -> Oracle:
    """Per arm of ``sel``, the candidate with the best mean final test metric (``sel.metric``; ties: the first in
    setting order, noted), beside ``sel``'s own choice. Floors are not applied: the bound is over every setting run."""
    rows, notes = [], []
    for arm, choice in sel.choices.items():
        means = [(c, mean_final(c.runs, sel.metric)) for c in choice.candidates]
        best, best_test, tied = best_of([(c, m) for c, m in means if m is not None], sel.maximize)
        if len(tied) > 1:
            notes.append(f"{arm}: {', '.join(tied)} tie on {sel.metric}; the first in setting order is shown")
        chosen = choice.chosen
        chosen_test = None if chosen is None else mean_final(chosen.runs, sel.metric)
        rows.append(OracleRow(arm, best, best_test, chosen, chosen_test, len(choice.candidates)))
    out = Oracle(sel.metric, rows, notes)
    validated = ("the validation rule's choice" if sel.refused is None
                 else "the validation rule's choice (refused here: none)")
    out.text = (f"{TITLE}. Per arm, the setting with the {'highest' if sel.maximize else 'lowest'} mean final "
                f"{sel.metric} over its seeds, chosen on the test prompts themselves, which a user of a learned reward "
                f"does not have: the number it reaches is biased upward by choosing on the prompts it is read on, an "
                f"upper bound on what tuning could give, and no verdict is drawn from it (it is in no family and not "
                f"in the first screen). Beside it, {validated} ({sel.rule}) and its mean final {sel.metric}; their "
                f"difference is what tuning without the oracle gave up." + "".join(f" {n}." for n in notes))
    return out
