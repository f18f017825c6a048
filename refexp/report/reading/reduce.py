"""One number per run and metric: the definitions behind every table cell.

Definitions (the "how to read this" paragraph of report.md repeats them):
- eval-cadence metrics (``eval/accuracy``, ``kl/init``; on ``task=preference``, which has no task
  accuracy, ``eval/pref_accuracy`` and ``eval/pref_margin`` on held-out pairs) are measured on a fixed
  held-out set every few steps, so "final" is the last logged value and "best" the test accuracy at the
  evaluation with the best validation accuracy (``val/accuracy``; without a validation split, the maximum);
- per-step training metrics (``reward/mean``, ``rewards/*``, ``kl/ref``) are batch estimates, noisy
  and, for ``kl/ref`` under a resetting strategy, saw-toothed; "final" is the mean of the last
  ``TAIL`` logged values so the number does not depend on where in a reset cycle the run ended
  (DPO logs ``kl/ref`` on the eval schedule, so there it is the mean of the last ``TAIL`` evaluations);
- steps to target: the first logged step whose ``eval/accuracy`` >= target (inf = never);
- reference cost: sum(perf/ref_fwd_s) / sum(perf/step_s) over the logged steps (a step that logs
  no ``perf/ref_fwd_s`` did no reference forward: it counts 0);
- peak memory: the maximum ``mem/peak_rss_mb`` logged.
When metrics.jsonl lacks a metric, status.json's ``final`` value is used for the "final" columns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from refexp.record.metric_names import (
    EVAL_ACCURACY,
    EVAL_GOLD,
    EVAL_PASS_AT_K,
    EVAL_PREF_ACCURACY,
    EVAL_PREF_MARGIN,
    EVAL_RETENTION,
    KL_INIT,
    KL_REF,
    LOGPS_CHOSEN_DELTA,
    MEM_PEAK_RSS_MB,
    PERF_REF_FWD_S,
    PERF_STEP_S,
    REWARD_MEAN,
    REWARDS_ACCURACIES,
    REWARDS_MARGINS,
    VAL_ACCURACY,
)
from refexp.report.reading.load import Run

TAIL = 5
"""How many last logged values a per-step training metric's "final" averages."""

ACC = EVAL_ACCURACY
VAL_ACC = VAL_ACCURACY
"""Accuracy on the validation split (when the task has one): what "best" is selected on."""
RETENTION = EVAL_RETENTION
"""Held-out accuracy on the skills RL does not train: what a run keeps of its start."""
GOLD = EVAL_GOLD
"""With a learned reward: the gold reward of the held-out greedy completions (their proxy is ``eval/accuracy``)."""
PREF_ACC = EVAL_PREF_ACCURACY
"""Held-out implicit-reward accuracy: a ``task=preference`` run's stand-in for ``eval/accuracy``."""


def last(run: Run, key: str) -> Optional[float]:
    """The last logged value, else status.json's final value."""
    _, v = run.series(key)
    return float(v[-1]) if len(v) else run.final_from_status(key)


def value_at(run: Run, key: str, step: int) -> Optional[float]:
    """The value logged at the last step at or before ``step`` (None when none was, or the run stopped
    logging ``key`` before reaching ``step``: a shorter run says nothing about it)."""
    steps, v = run.series(key)
    if not len(v) or steps[-1] < step:
        return None
    i = int(np.searchsorted(steps, step, side="right")) - 1
    return float(v[i]) if i >= 0 else None


def tail_mean(run: Run, key: str, k: int = TAIL) -> Optional[float]:
    """Mean of the last ``k`` logged values, else status.json's final value."""
    _, v = run.series(key)
    return float(np.mean(v[-k:])) if len(v) else run.final_from_status(key)


def best(run: Run, key: str) -> Optional[float]:
    _, v = run.series(key)
    return float(np.max(v)) if len(v) else None


def best_on_validation(run: Run, key: str = ACC) -> Optional[float]:
    """``key`` (held-out test accuracy) at the evaluation whose ``val/accuracy`` is highest (the first such):
    the model a researcher would select, reported on prompts never used to select it. Without a validation
    split, the maximum of ``key`` itself (a selection on the test prompts, optimistic by their noise)."""
    vs, vv = run.series(VAL_ACC)
    ks, kv = run.series(key)
    if not len(vv) or not len(kv):
        return best(run, key)
    at = dict(zip(ks.tolist(), kv.tolist()))
    for i in np.argsort(-vv, kind="stable"):  # the best validation step that also has a test value
        if vs[i] in at:
            return float(at[vs[i]])
    return best(run, key)


def change_from_start(run: Run, key: str) -> Optional[float]:
    """The last logged value minus the first (step 0: the start), both on one set of prompts."""
    _, v = run.series(key)
    return float(v[-1] - v[0]) if len(v) else None


def start_accuracy(run: Run) -> Optional[float]:
    """Held-out accuracy at the first eval (step 0: the SFT start the run trains from)."""
    _, v = run.series(ACC)
    return float(v[0]) if len(v) else None


def steps_to_target(run: Run, target: float) -> Optional[float]:
    """First step with eval/accuracy >= target; ``math.inf`` when never; None without eval data."""
    steps, v = run.series(ACC)
    if not len(v):
        return None
    hit = np.nonzero(v >= target - 1e-12)[0]  # tolerance: 0.7 logged as 0.7000000000000001 vs 0.7
    return float(steps[hit[0]]) if len(hit) else math.inf


def ref_cost(run: Run) -> Optional[float]:
    """Share of step time spent in the reference forward, in [0, 1]."""
    step_s = ref_s = 0.0
    seen = False
    for row in run.rows:
        t = row.get(PERF_STEP_S)
        if isinstance(t, (int, float)) and not isinstance(t, bool):
            seen = True
            step_s += t
            r = row.get(PERF_REF_FWD_S)
            ref_s += r if isinstance(r, (int, float)) and not isinstance(r, bool) else 0.0
    return ref_s / step_s if seen and step_s > 0 else None


def peak(run: Run, key: str) -> Optional[float]:
    _, v = run.series(key)
    return float(np.max(v)) if len(v) else run.final_from_status(key)


@dataclass(frozen=True)
class Column:
    """One table column: a per-run number, how to print it, and what it means."""

    key: str
    header: str
    per_run: Callable[[Run], Optional[float]]
    kind: str = "num"  # num | pct | int
    doc: str = ""
    doc_name: str = ""
    """The number in words, for a sentence ("final held-out accuracy")."""
    binomial: bool = False
    """An accuracy on the run's ``eval.num_prompts`` held-out prompts: its interval includes that
    evaluation's binomial noise (``stats.with_evaluation_noise``)."""


def at_step_columns(steps: tuple[int, ...], metric: str = ACC) -> tuple[Column, ...]:
    """For each step S: ``metric`` at the last evaluation at or before S (``acc@S`` for ``eval/accuracy``,
    ``gold@S`` for ``eval/gold``) and its gain after S (final minus that): whether a group kept improving after S,
    with an interval. ``metric``: the headline (``comparison.metric``), one of ``FINAL_COLUMNS``."""
    final = next(c for c in COLUMNS if c.key == FINAL_COLUMNS[metric])
    short = at_step_prefix(metric)
    what = final.doc_name.removeprefix("final ")
    cols: list[Column] = []
    for s in steps:
        cols.append(Column(f"{short}_at_{s}", f"{short}@{s}", lambda r, s=s: value_at(r, metric, s),
                           binomial=final.binomial, doc=f"{metric} at the last evaluation at or before step {s}",
                           doc_name=f"{what} at step {s}"))
        cols.append(Column(f"gain_after_{s}" if metric == ACC else f"{short}_gain_after_{s}",
                           f"gain after {s}" if metric == ACC else f"{short} gain after {s}",
                           lambda r, s=s: _gain_after(r, s, metric),
                           doc=f"last {metric} minus {metric} at step {s} (one set of prompts: a within-run "
                               f"difference, so no binomial term)",
                           doc_name=f"{what} gained after step {s}"))
    return tuple(cols)


def at_step_prefix(metric: str) -> str:
    """The short name of ``metric``'s at-step columns (``acc`` for ``eval/accuracy``: ``acc@S``, key ``acc_at_S``)."""
    return FINAL_COLUMNS[metric].removesuffix("_final")


def _gain_after(run: Run, step: int, metric: str = ACC) -> Optional[float]:
    at, end = value_at(run, metric, step), last(run, metric)
    return None if at is None or end is None else end - at


COLUMNS: tuple[Column, ...] = (
    Column("acc_final", "final acc", lambda r: last(r, ACC), doc="last eval/accuracy",
           doc_name="final held-out accuracy", binomial=True),
    Column("acc_best", "best acc", best_on_validation, binomial=True,
           doc="eval/accuracy at the evaluation with the highest val/accuracy (without a validation split: max "
               "eval/accuracy)"),
    Column("retention_final", "final retention", lambda r: last(r, RETENTION), binomial=True,
           doc="last eval/retention (held-out exact match on the skills RL does not train)",
           doc_name="final held-out retention"),
    Column("retention_change", "Δ retention", lambda r: change_from_start(r, RETENTION),
           doc="last eval/retention minus its step-0 value (one set of prompts: a within-run difference, so no "
               "binomial term)", doc_name="retention change from the start"),
    Column("gold_final", "final gold", lambda r: last(r, GOLD),
           doc="last eval/gold (with a learned reward: the gold reward of the held-out greedy completions; the "
               "verifier's 0/1 unless task.gold_reward_model)", doc_name="final held-out gold reward"),
    Column("pass_at_k_final", "final pass@k", lambda r: last(r, EVAL_PASS_AT_K),
           doc="last eval/pass_at_k (k samples at the training temperature)", doc_name="final held-out pass@k"),
    Column("heldout_pref_final", "final held-out pref acc", lambda r: last(r, PREF_ACC), doc=f"last {PREF_ACC}",
           doc_name="final held-out preference accuracy"),
    Column("heldout_pref_best", "best held-out pref acc", lambda r: best(r, PREF_ACC), doc=f"max {PREF_ACC}"),
    Column("heldout_margin", "final held-out margin", lambda r: last(r, EVAL_PREF_MARGIN),
           doc="last eval/pref_margin"),
    Column("reward", "reward", lambda r: tail_mean(r, REWARD_MEAN),
           doc=f"reward/mean, mean of last {TAIL} logged"),
    Column("pref_acc", "pref acc", lambda r: tail_mean(r, REWARDS_ACCURACIES),
           doc=f"DPO rewards/accuracies (rewards/accuracy in older runs), mean of last {TAIL} logged"),
    Column("margin", "margin", lambda r: tail_mean(r, REWARDS_MARGINS),
           doc=f"DPO rewards/margins (rewards/margin in older runs), mean of last {TAIL} logged"),
    Column("chosen_delta", "chosen Δlogp", lambda r: last(r, LOGPS_CHOSEN_DELTA),
           doc="DPO: last logps/chosen_delta, the chosen completions' summed log-prob minus its step-0 value"),
    Column("kl_init", KL_INIT, lambda r: last(r, KL_INIT), doc="last kl/init"),
    Column("kl_ref", KL_REF, lambda r: tail_mean(r, KL_REF), doc=f"kl/ref, mean of last {TAIL} logged"),
    Column("ref_cost", "ref cost", ref_cost, kind="pct", doc="sum perf/ref_fwd_s / sum perf/step_s"),
    Column("peak_rss_mb", "peak RSS MB", lambda r: peak(r, MEM_PEAK_RSS_MB), kind="int",
           doc="max mem/peak_rss_mb"),
)
"""Every column a table can have; a table shows only those some group of its algorithm has data
for (so GRPO shows reward, DPO shows pref acc and margin, and DPO on ``task=preference`` its held-out
pair columns instead of accuracy)."""

FINAL_COLUMNS = {ACC: "acc_final", RETENTION: "retention_final", GOLD: "gold_final"}
"""A held-out metric with per-prompt outcomes -> the column of its final value: the metrics a comparison can be
about (``plan.py``'s ``PRIMARY_ENDPOINTS``)."""
