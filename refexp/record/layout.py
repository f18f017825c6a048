"""The names of what a run writes in its run dir, stated once (the writers and readers of
``refexp/record/`` build their paths from them).
"""

from __future__ import annotations

from pathlib import Path

STATUS = "status.json"
"""What became of the run: running (with a heartbeat) / completed / failed / preempted, with the error
(``record/status.py``; docs/runs.md)."""
METRICS = "metrics.jsonl"
"""One JSON object per logged step, with ``step`` (``record/metrics.py``; the names: ``record/metric_names.py``)."""
SAMPLES = "samples.jsonl"
"""Sample completions: ``{step, kind, prompt, completion, answer, reward, ...}`` rows (``record/samples.py``)."""
EVAL_OUTCOMES = "eval_outcomes.jsonl"
"""Each evaluation's per-prompt scores, one line per evaluation and split (``record/outcomes.py``)."""
RESOLVED_CONFIG = "resolved_config.yaml"
"""The configuration the run used, interpolations resolved (``record/resolved_config.py``)."""
WANDB_ID = "wandb_id"
"""The W&B run id, kept so that a resumed run continues its W&B run."""
WANDB_DIR = "wandb"
"""W&B's local files (``wandb sync <run dir>/wandb`` uploads an offline run)."""
LOCK = ".refexp.lock"
"""Held by the one process writing the run dir, naming it (host, pid, start; ``record/lock.py``)."""
RERUN_DIR = ".rerun"
"""A rerun's copy of a completed run's record, written until the rerun passes that run's end (``record/rerun.py``)."""
HYDRA_DIR = ".hydra"
"""Hydra's own record of the job (``config.yaml``, ``overrides.yaml``)."""

RUN_MARKERS = (HYDRA_DIR, METRICS, STATUS)
"""A directory holding any of these is a run dir (the report's test)."""


def path(run_dir: str | Path, name: str) -> Path:
    """``<run_dir>/<name>``."""
    return Path(run_dir) / name
