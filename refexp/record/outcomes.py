"""``eval_outcomes.jsonl``: what every evaluation scored on each held-out prompt, so that two runs (two
strategies on one task) can be compared prompt by prompt, not only by their means.

One line per evaluation and metric: ``{step, split, metric, prompt_ids, scores}``; ``prompt_ids[i]`` is the
row of the split (the ``Task`` attribute: ``eval``, ``val``, ``retain_eval``, ``retain_val``) that scored
``scores[i]``, and the mean of ``scores`` is the logged metric (``eval/accuracy``, ``val/accuracy``,
``eval/retention``, ``val/retention``, ``eval/pass_at_k``, and ``kl/init``, ``kl/init_retain`` whose scores are each
prompt's linearised contribution to the token-weighted KL: refexp/components/evaluation.py). Written by rank 0,
never sent to W&B.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

from refexp.record import layout
from refexp.record.jsonl import line, read_rows


@dataclass(frozen=True)
class EvalOutcomes:
    """One evaluation's per-prompt scores on one split."""

    split: str
    """The ``Task`` split the prompts are rows of: ``eval`` (the held-out test prompts of the RL skills), ``val``,
    ``retain_eval`` / ``retain_val`` (the skills RL does not train)."""
    metric: str
    """The metric the scores average into (``eval/accuracy``): a run's outcomes are keyed by it."""
    prompt_ids: list[int]
    """Row indices of the split, in order."""
    scores: list[float]
    """Each prompt's score: the reward of its greedy completion, or its pass@k estimate (``eval/pass_at_k``)."""


def append_outcomes(run_dir: str | Path, step: int, outcomes: Iterable[EvalOutcomes]) -> None:
    """The evaluations of one step, appended."""
    with open(layout.path(run_dir, layout.EVAL_OUTCOMES), "a") as f:
        for o in outcomes:
            f.write(line({"step": step, **asdict(o)}))


def read_outcomes(run_dir: str | Path) -> list[tuple[int, EvalOutcomes]]:
    """``(step, outcomes)`` of every complete line, in the order written."""
    return [(int(r["step"]), EvalOutcomes(r["split"], r["metric"], list(r["prompt_ids"]), list(r["scores"])))
            for r in read_rows(layout.path(run_dir, layout.EVAL_OUTCOMES))]
