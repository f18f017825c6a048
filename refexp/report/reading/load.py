"""Find the run directories of a sweep and read what each run wrote.

Only files are read, through the run record's readers (``refexp/record/``, torch-free), so a report can
be made on a laptop from a copied sweep directory and while the sweep is still running.

Per run dir (see the contract in ``refexp/report/__init__.py``):
``.hydra/config.yaml``, ``.hydra/overrides.yaml``, ``resolved_config.yaml``,
``metrics.jsonl``, ``status.json``, ``eval_outcomes.jsonl``. Any of them may be missing or half-written.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Optional

import numpy as np
import yaml

from refexp.choices import current_choice
from refexp.record import layout
from refexp.record.metric_names import EVAL_ACCURACY, current_names
from refexp.record.metrics import read_metrics
from refexp.record.outcomes import read_outcomes
from refexp.record.resolved_config import read_resolved_config
from refexp.record.samples import read_samples
from refexp.record.status import read_status_file, stale_reason
from refexp.report.reading.interpolation import resolve_interpolations

_NOT_RUNS = {layout.WANDB_DIR, "report_plots", "__pycache__"}
"""Folders in a sweep dir that are never runs: W&B's local files and this report's own plots."""


def is_run_dir(path: Path) -> bool:
    """A run dir holds any of ``.hydra/``, ``metrics.jsonl`` or ``status.json``."""
    return any((path / m).exists() for m in layout.RUN_MARKERS)


def find_run_dirs(sweep_dir: Path) -> list[Path]:
    """Every run dir at or below ``sweep_dir``, in natural order (2 before 10).

    Hidden dirs (``.submitit``, ``.hydra``) and ``_NOT_RUNS`` are never searched, and the walk does not go below a
    run dir: checkpoints and ``wandb/`` inside a run are not runs.
    """
    sweep_dir = Path(sweep_dir)
    if is_run_dir(sweep_dir):
        return [sweep_dir]
    found: list[Path] = []
    for root, dirs, _files in os.walk(sweep_dir):
        here = Path(root)
        if here != sweep_dir and is_run_dir(here):
            found.append(here)
            dirs[:] = []
            continue
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in _NOT_RUNS]
    return sorted(found, key=lambda p: natural_key(str(p.relative_to(sweep_dir))))


def natural_key(text: str) -> list:
    """Sort key that orders embedded numbers by value, decimals too ("2" < "10", "a=5" < "a=20",
    "beta=0.05" < "beta=0.1")."""
    return [(0, float(t), "") if t[0].isdigit() else (1, 0, t) for t in re.split(r"(\d+(?:\.\d+)?)", text) if t]


def sft_start_keys(runs: Iterable["Run"]) -> list[str]:
    """The SFT starts ``runs`` trained from (``Run.sft_start``), each once, in natural order."""
    return sorted({r.sft_start for r in runs}, key=natural_key)


def _read_yaml(path: Path) -> Any:
    """YAML as plain Python; ``${...}`` interpolations stay strings (nothing is resolved here)."""
    try:
        with open(path) as f:
            return yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return None


def read_config(run_dir: Path) -> dict:
    """The run's config: ``resolved_config.yaml`` (what the run used) or else ``.hydra/config.yaml``.

    The Hydra file's node interpolations are followed and no resolver runs (``interpolation.py``: an ``oc.env`` would
    read this machine's environment into the report); a value that calls one (``${hydra:...}``, ``${now:...}``)
    keeps its text.
    """
    resolved = read_resolved_config(run_dir)
    if resolved is not None:
        return resolved
    raw = _read_yaml(run_dir / layout.HYDRA_DIR / "config.yaml")
    return resolve_interpolations(raw) if isinstance(raw, dict) else {}


def read_overrides(run_dir: Path) -> list[str]:
    """``.hydra/overrides.yaml`` as a list of ``key=value`` strings ([] when absent)."""
    data = _read_yaml(run_dir / layout.HYDRA_DIR / "overrides.yaml")
    return [str(x) for x in data] if isinstance(data, list) else []


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _get(d: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


@dataclass
class Run:
    """One job of the sweep, as read from disk."""

    path: Path
    name: str
    """Path relative to the sweep dir ("0", "3/1", or "." for a single run dir)."""
    config: dict = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)
    status: Optional[dict] = None
    status_problem: Optional[str] = None
    """Why status.json could not be used (missing / unreadable), else None."""
    rows: list[dict] = field(default_factory=list)
    bad_lines: int = 0
    has_metrics_file: bool = False

    def override(self, key: str) -> Optional[str]:
        """The value the job's overrides give ``key`` (``grpo_variant``), else None."""
        for o in self.overrides:
            k, _, v = o.lstrip("+~").partition("=")
            if k == key:
                return v
        return None

    def _first(self, status_key: str, config_key: str, group: str = "") -> Any:
        """From status.json, else the config, else the overrides (``config_key`` or the config
        group's choice ``group=...``): the trainer's own word wins."""
        for v in ((self.status or {}).get(status_key), _get(self.config, config_key),
                  self.override(config_key), self.override(group) if group else None):
            if v is not None and v != "":
                return v
        return None

    @property
    def algo(self) -> str:
        return str(self._first("algo", "algo.name", "algo") or "unknown")

    @property
    def strategy(self) -> str:
        return str(self._first("reference", "reference.name", "reference") or "unknown")

    @property
    def loss_type(self) -> Optional[str]:
        """DPO's ``algo.loss_type`` (None for other algorithms, or when the run does not record it)."""
        v = self._first("loss_type", "algo.loss_type")
        return str(v) if v is not None else None

    @property
    def objective(self) -> str:
        """GRPO's ``algo.objective`` (``continued_sft``: the continued-SFT baseline); ``grpo`` when not recorded.
        A run recorded before the rename (``algo.objective: sft``) reads as ``continued_sft``: the renamed
        choices of ``refexp/choices.py``'s ``RENAMED_CHOICES``, as ``current_names`` reads renamed metrics."""
        return str(current_choice("algo.objective", self._first("objective", "algo.objective") or "grpo"))

    @property
    def eval_prompts(self) -> Optional[int]:
        """How many held-out prompts ``eval/accuracy`` averages: ``eval.num_prompts``, at most the held-out
        split's ``task.num_eval`` when that is the split's size (no ``task.eval_path``); None when not recorded."""
        n = _get(self.config, "eval.num_prompts")
        if n is None:
            return None
        held_out = _get(self.config, "task.num_eval") if _get(self.config, "task.eval_path") is None else None
        return int(min(int(n), int(held_out))) if held_out is not None else int(n)

    @property
    def reset_every(self) -> Optional[int]:
        """``reference.reset_every`` of a periodic_reset run (None for other strategies or when not recorded)."""
        v = self._first("reset_every", "reference.reset_every")
        return int(v) if v is not None else None

    @property
    def nll_weight(self) -> float:
        """DPO's ``algo.nll_weight`` (RPO's NLL term; 0 when off or not recorded)."""
        v = self._first("nll_weight", "algo.nll_weight")
        try:
            return float(v) if v is not None else 0.0
        except (TypeError, ValueError):
            return 0.0

    @property
    def seed(self) -> Optional[int]:
        v = self._first("seed", "training.seed")
        try:
            return int(v) if v is not None else None
        except (TypeError, ValueError):
            return None

    @property
    def sft_start(self) -> str:
        """The SFT start the run trained from, the unit its seeds are nested in: ``status.json``'s ``sft_start`` key
        (the SFT cache entry's name), else ``sft.seed=N`` from the config or overrides (a run that predates that
        record: every run of such a sweep with one ``sft.seed`` shares one start), else "" (not recorded)."""
        recorded = (self.status or {}).get("sft_start")
        if isinstance(recorded, dict) and recorded.get("key"):
            return str(recorded["key"])
        seed = _get(self.config, "sft.seed")
        seed = seed if seed is not None else self.override("sft.seed")
        return f"sft.seed={seed}" if seed is not None else ""

    @property
    def state(self) -> str:
        """completed | failed | running | stale (running, but its process is gone) | incomplete (no or
        unreadable status.json, or another status)."""
        if self.status is None:
            return "incomplete"
        s = str(self.status.get("status", "incomplete"))
        if s == "running" and stale_reason(self.status):
            return "stale"
        return s if s in ("completed", "failed", "running") else "incomplete"

    @property
    def problem(self) -> Optional[str]:
        """Why this run is left out of the numbers (None when it is a usable completed run)."""
        if self.state == "completed":
            if not self.rows:
                what = "has no readable line" if self.has_metrics_file else "is missing"
                return f"status is completed but metrics.jsonl {what}"
            return None
        if self.state == "failed":
            return str((self.status or {}).get("error") or "failed (no error message recorded)")
        progress = self._progress()
        if self.state == "running":
            return f"still running or killed{progress}"
        if self.state == "stale":
            return f"{stale_reason(self.status)}{progress}"
        if self.status is not None:
            why = f"status.json says status={self.status.get('status')!r}"
        else:
            why = self.status_problem or "no status.json"
        return f"{why} (not finished, or killed){progress}"

    def _progress(self) -> str:
        # status.json's last_step is written at the start and the end; a running run's rows are newer
        steps = [s for s in ((self.status or {}).get("last_step"), self.rows[-1]["step"] if self.rows else None)
                 if isinstance(s, int)]
        last = max(steps) if steps else None
        planned = (self.status or {}).get("steps") or _get(self.config, "training.steps")
        if last is None:
            return ""
        return f"; last step {last}" + (f" of {planned}" if planned is not None else "")

    @cached_property
    def _series(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """metric -> (steps, values), one value per step.

        When a step appears twice (a resumed run re-logs the steps after its last checkpoint),
        the later line wins: it belongs to the run that went on to finish.
        """
        per_key: dict[str, dict[float, float]] = {}
        for row in self.rows:
            step = row["step"]
            for k, v in current_names(row).items():  # a row with both names: the new one is the measurement
                if k != "step" and _is_number(v):
                    per_key.setdefault(k, {})[step] = float(v)
        out = {}
        for k, d in per_key.items():
            steps = np.array(sorted(d), dtype=float)
            out[k] = (steps, np.array([d[s] for s in sorted(d)], dtype=float))
        return out

    @cached_property
    def _outcomes(self) -> dict[str, dict[int, dict[int, float]]]:
        """metric -> step -> {prompt id: score}, from ``eval_outcomes.jsonl`` ({} for a run written before that
        file existed); a step written twice (a resumed run): the later line wins."""
        out: dict[str, dict[int, dict[int, float]]] = {}
        for step, o in read_outcomes(self.path):
            out.setdefault(o.metric, {})[step] = dict(zip((int(i) for i in o.prompt_ids),
                                                          (float(x) for x in o.scores)))
        return out

    def outcomes_of(self, metric: str) -> dict[int, dict[int, float]]:
        """step -> {prompt id: score} of every evaluation of ``metric`` (``eval/accuracy``, ``eval/retention``,
        ...) with per-prompt outcomes; {} when there is none."""
        return self._outcomes.get(metric, {})

    @property
    def outcomes(self) -> dict[int, dict[int, float]]:
        """``outcomes_of(eval/accuracy)``: the held-out test evaluations of the RL skills."""
        return self.outcomes_of(EVAL_ACCURACY)

    def metric_names(self) -> set[str]:
        """Every metric this run logged at least once."""
        return set(self._series)

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of one metric; empty arrays when the run never logged it."""
        return self._series.get(key, (np.array([]), np.array([])))

    def final_samples(self, kind: str = "eval", k: int = 3) -> list[dict]:
        """The first ``k`` sample completions of the run's last logged step of ``kind`` (``samples.jsonl``:
        greedy held-out completions at each evaluation, or GRPO's ``rollout`` samples)."""
        rows = read_samples(self.path, kind)
        if not rows:
            return []
        last = max(r["step"] for r in rows)
        return [r for r in rows if r["step"] == last][:k]

    def final_from_status(self, key: str) -> Optional[float]:
        """status.json's ``final`` value of a metric, the fallback when metrics.jsonl lacks it."""
        v = current_names((self.status or {}).get("final") or {}).get(key)  # a run logged before a rename
        return float(v) if _is_number(v) and math.isfinite(v) else None


def load_run(run_dir: Path, sweep_dir: Path) -> Run:
    """Read one run dir; never raises on missing or broken files."""
    run = Run(path=run_dir, name=str(run_dir.relative_to(sweep_dir)) if run_dir != sweep_dir else ".")
    run.config = read_config(run_dir)
    run.overrides = read_overrides(run_dir)
    run.status, run.status_problem = read_status_file(run_dir)
    run.has_metrics_file = layout.path(run_dir, layout.METRICS).exists()
    run.rows = read_metrics(run_dir)
    run.bad_lines = run.rows.bad_lines
    return run


def load_sweep(sweep_dir: Path) -> list[Run]:
    """Every run of the sweep (or the one run, when given a run dir)."""
    sweep_dir = Path(sweep_dir)
    return [load_run(d, sweep_dir) for d in find_run_dirs(sweep_dir)]
