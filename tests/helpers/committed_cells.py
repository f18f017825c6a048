"""What the current verdict rule decides for one cell of a committed ``docs/<experiment>/summary.json``.

The runs behind most committed reports are not kept, so their reports cannot be re-rendered; their summaries keep
each comparison's difference, simultaneous interval, unadjusted and Holm-adjusted p and the per-unit differences
of its Student t. From those this module re-applies the rule ``refexp.report.statistics.inference`` applies today
(Holm's step-down decides; a degenerate t enters Holm with p 1 and makes no claim; an interval past ±1 on a
difference of proportions is uninformative). It cannot redo the shared-prompt bootstrap: the intervals and
unadjusted p's are the ones the report was rendered with.

A docs page cites a cell with an HTML comment right after the verdict phrase that quotes it:

    ``<!-- paired DIR | ALGO | START | ARM | METRIC -->``
        ``algos[ALGO].within_sft_start[START].paired_vs_baseline[ARM][METRIC]`` (START ``all``: the group
        ARM's own ``paired_vs_baseline[METRIC]``, the start as the unit);
    ``<!-- kept DIR | ALGO | START | GROUP -->``
        the row of group GROUP in ``algos[ALGO].kept.within[START].rows`` (START ``all``: ``kept.rows``);

    ``<!-- primary DIR | CONTRAST | ENDPOINT -->``
        the first-screen line of ``primary_contrasts`` whose contrast and endpoint these are;
    ``<!-- peak DIR | ALGO | GROUP -->`` / ``<!-- peakarm DIR | ALGO | ARM -->``
        a row of ``algos[ALGO].gold_peak.groups`` (the group's gold at its peak against its step 0) or of its
        ``arms`` (the arm at its gold peak against the baseline's);
    ``<!-- best DIR | GROUP -->``
        ``frontier.selection.verdicts[GROUP]``: an arm at the setting its validation rule chose, against the
        baseline's;

DIR is the report's folder under ``docs/`` (e.g. ``frontier_grpo/paired_against_none``).

The last four kinds are read only from a report whose runs are kept beside it (its ``runs.tar.xz``):
``tests/test_report_version.py`` makes such a report the current report version's, so its printed verdict is the
current rule's, equivalence included; a paired or kept cell of such a report is decided by its printed verdict too.

A paired cell's Holm p is recomputed over its family from the unadjusted p's (a degenerate t entering as 1);
a kept row stores no unadjusted p, so its committed Holm p is read as it is.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

from refexp.report.statistics.inference import INCONCLUSIVE, holm, verdict_word

DOCS = Path(__file__).resolve().parents[2] / "docs"
MARKER = re.compile(r"<!--\s*(paired|kept|primary|peak|peakarm|best)\s+([^>]*?)\s*-->")

UNINFORMATIVE = "uninformative"
PROPORTION_METRICS = ("acc_", "retention_", "pass_at_k", "heldout_pref")
"""Cell names whose metric is a share of prompts (a difference lies in [-1, 1])."""


@dataclass(frozen=True)
class Cell:
    """One committed comparison and the verdict the current rule gives it."""

    where: str
    difference: float
    interval: tuple[float, float]
    printed: str
    """The verdict word the committed report printed (the rules then in force)."""
    decided: str
    """higher / lower / inconclusive / uninformative / degenerate t, by the current rule."""


@lru_cache(maxsize=None)
def summary(folder: str) -> dict:
    path = DOCS / folder / "summary.json"
    if not path.is_file():
        raise FileNotFoundError(f"cell marker names docs/{folder}, which has no summary.json")
    return json.loads(path.read_text())


def _degenerate(cell: dict) -> bool:
    """The per-unit differences of the cell's Student t are identical (no spread: the t tests nothing)."""
    values = (cell.get("seed_only_t95") or {}).get("values") or []
    return len(values) >= 2 and max(values) - min(values) <= 1e-9


def _rule(cell: dict, p_holm: float, alpha: float, proportion: bool) -> str:
    word = verdict_word(cell.get("difference", cell.get("change")), p_holm, alpha, None, _degenerate(cell))
    low, high = cell["interval"]
    if word == INCONCLUSIVE and proportion and (low < -1.0 or high > 1.0):
        return UNINFORMATIVE
    return word


def _paired_family_holm(family: dict, metric: str, alpha: float) -> dict[str, float]:
    """Holm over the family's unadjusted p's, a degenerate t's entering as 1 (``inference.family_verdicts``)."""
    arms = [a for a, cells in family.items() if cells and (cells.get(metric) or {}).get("p_unadjusted") is not None]
    p = [1.0 if _degenerate(family[a][metric]) else family[a][metric]["p_unadjusted"] for a in arms]
    return dict(zip(arms, holm(p, alpha).adjusted)) if arms else {}


@lru_cache(maxsize=None)
def runs_stored(folder: str) -> bool:
    """Whether the report in ``docs/<folder>`` has its runs stored beside it, as its ``runs.tar.xz`` (the one way a
    committed report stores them: tests/test_what_git_holds.py); a report without them is marked "runs not kept"
    (``refexp/report/writing/runs_not_stored.py``)."""
    from refexp.report.reading.archive import ARCHIVE
    return (DOCS / folder / ARCHIVE).is_file()


def _printed(folder: str, kind: str, spec: str) -> Cell:
    """A cell of a current report (``primary``, ``peak``, ``peakarm``, ``best``): its printed verdict is the
    rule's."""
    fields = [f.strip() for f in spec.split("|")]
    s = summary(folder)
    where = f"docs/{folder}/summary.json {kind} {' | '.join(fields[1:])}"
    if not runs_stored(folder):
        raise KeyError(f"{where}: its runs are not kept beside it, so its printed verdict may be an older rule's; "
                       f"cite a paired or kept cell")
    if kind == "best":
        verdicts = s["frontier"]["selection"]["verdicts"]
        match = [verdicts[fields[1]]] if fields[1] in verdicts else []
        names = sorted(verdicts)
    elif kind == "primary":
        contrast, endpoint = fields[1:3]
        match = [c for c in s["primary_contrasts"] if c["contrast"] == contrast and c["endpoint"] == endpoint]
        names = [(c["contrast"], c["endpoint"]) for c in s["primary_contrasts"]]
    else:
        algo, name = fields[1:3]
        peak = s["algos"][algo]["gold_peak"] or {}
        rows, key = (peak.get("groups", []), "group") if kind == "peak" else (peak.get("arms", []), "arm")
        match = [r for r in rows if r[key] == name]
        names = [r[key] for r in rows]
    if len(match) != 1:
        raise KeyError(f"{where}: no such cell (there are {names})")
    cell = match[0]
    text = cell.get("verdict_text") or cell["verdict"]
    decided = printed_word(text, "no claim")
    difference = cell.get("difference", cell.get("change"))
    return Cell(where, difference, tuple(cell["interval"]) if cell.get("interval") else (float("nan"),) * 2,
                text, decided)


def resolve(kind: str, spec: str) -> Cell:
    """The cell a marker names (``kind`` paired, kept, primary, peak, peakarm or best; ``spec`` its
    ``|``-separated fields)."""
    fields = [f.strip() for f in spec.split("|")]
    if kind in ("primary", "peak", "peakarm", "best"):
        return _printed(fields[0], kind, spec)
    folder, algo, start = fields[:3]
    s = summary(folder)
    alpha = (s.get("comparison") or {}).get("alpha") or 0.05
    a = s["algos"][algo]
    where = f"docs/{folder}/summary.json {kind} {' | '.join(fields[1:])}"
    if kind == "paired":
        arm, metric = fields[3:5]
        if start == "all":
            family = {g["label"]: g.get("paired_vs_baseline") for g in a["groups"]}
        else:
            family = a["within_sft_start"][start]["paired_vs_baseline"]
        if arm not in family or not family[arm] or metric not in family[arm]:
            raise KeyError(f"{where}: no such cell (arms: {sorted(family)})")
        cell = family[arm][metric]
        p_holm = _paired_family_holm(family, metric, alpha).get(arm, cell["p_holm"])
        proportion = metric.startswith(PROPORTION_METRICS)
    else:
        (group,) = fields[3:4]
        rows = a["kept"]["rows"] if start == "all" else a["kept"]["within"][start]["rows"]
        match = [r for r in rows if r["group"] == group]
        if len(match) != 1:
            raise KeyError(f"{where}: no such row (groups: {[r['group'] for r in rows]})")
        cell = match[0]
        p_holm = cell["p_holm"]
        proportion = True  # a change of retention, a share of prompts
    decided = _rule(cell, p_holm, alpha, proportion)
    if runs_stored(folder):  # the current rule's printed word: equivalence too, which the recomputation cannot see
        decided = printed_word(cell["verdict"], decided)
    return Cell(where, cell.get("difference", cell.get("change")), tuple(cell["interval"]), cell["verdict"], decided)


VERDICT_IN_TEXT = re.compile(r"(higher|lower|inconclusive|uninformative|degenerate t|equivalent within)")


def printed_word(text: str, default: str) -> str:
    """The first verdict word of a report's printed verdict, else ``default``."""
    words = VERDICT_IN_TEXT.findall(text)
    return words[0] if words else default


PHRASE_IN_TEXT = re.compile(r"(degenerate t|higher|lower|inconclusive|uninformative|equivalent within|no claim)")
"""The verdict words a page may write before a marker: the rule's, and "no claim" for a primary contrast the
report could not test (its declared value outside some replicate's runs); "a degenerate t: no claim" is the
degenerate t's."""


def phrase_before(text: str, marker_start: int) -> Optional[str]:
    """The last verdict word in the text between the previous marker (or the paragraph's start) and a marker."""
    prev = max(text.rfind("-->", 0, marker_start), text.rfind("\n\n", 0, marker_start))
    span = re.sub(r"degenerate t: no claim", "degenerate t", text[prev + 1:marker_start])
    words = PHRASE_IN_TEXT.findall(span)
    return words[-1] if words else None


def interval_text(interval: tuple[float, float]) -> str:
    """"[−0.075, +0.335]" as the docs print an interval (Unicode minus)."""
    return "[" + ", ".join(f"{v:+.3f}".replace("-", "−") for v in interval) + "]"
