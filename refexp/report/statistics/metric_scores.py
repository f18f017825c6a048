"""Any evaluation metric's final per-prompt scores, and the paired result of two runs' (or two interpolations')
scores over seeds.

``Run.outcomes`` holds the test accuracy's scores only; a comparison of another metric (``eval/retention``) reads
its own lines of ``eval_outcomes.jsonl`` here, by the metric each line names. The result is the verdict table's:
a paired hierarchical bootstrap (seeds, or SFT starts then seeds, then prompts) that must agree with Student's t
over the per-seed (per-start) differences (``paired.BothLevelsResult``), or that t alone without per-prompt scores.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from refexp.report.reading.load import Run
from refexp.report.reading.reduce import last
from refexp.report.statistics.paired import BothLevelsResult, SeedOnlyResult, Unit, unit_result


def final_scores(run: Run, metric: str) -> Optional[dict[int, float]]:
    """{prompt id: score} of the run's last evaluation of ``metric`` (``eval/accuracy``), when that evaluation is
    the last value of ``metric`` the run logged; None without per-prompt scores for it."""
    by_step = run.outcomes_of(metric)  # read once per run (Run._outcomes), the later line of a step written twice
    steps, _ = run.series(metric)
    if not by_step or not len(steps) or max(by_step) != int(steps[-1]):
        return None
    return by_step[max(by_step)]


def final_value(run: Run, metric: str) -> Optional[float]:
    """The metric's last logged value (status.json's final value when metrics.jsonl lacks it)."""
    return last(run, metric)


def paired_result(per_unit: dict[Unit, tuple[Optional[np.ndarray], Optional[np.ndarray], float, Sequence[int]]]
                  ) -> Optional[BothLevelsResult | SeedOnlyResult]:
    """``per_unit``: (SFT start, seed) -> (arm's scores [P] or None, baseline's scores [P] or None, arm - baseline
    of the metric's values, the prompt ids [P] of the scores). The verdict table's paired result over those units
    (``paired.unit_result``: seeds, or starts then seeds, then prompts, one prompt draw for every unit when they
    share their prompts, with the Student-t companion); the t alone without every unit's scores; None with one
    start of fewer than 2 seeds."""
    units = {u: ((a, b, ids) if a is not None and b is not None else None, float(d))
             for u, (a, b, d, ids) in per_unit.items()}
    return unit_result(units)[0]


def aligned(scores: list[Optional[dict[int, float]]]) -> Optional[tuple[list[int], list[np.ndarray]]]:
    """The prompt ids every one of ``scores`` has (in the first's order) and each one's scores over them [P];
    None when one has no scores or they share no prompt."""
    if any(s is None for s in scores):
        return None
    ids = [i for i in scores[0] if all(i in s for s in scores[1:])]
    if not ids:
        return None
    return ids, [np.array([s[i] for i in ids], dtype=float) for s in scores]
