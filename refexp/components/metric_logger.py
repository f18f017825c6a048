"""Metrics out: ``<run dir>/metrics.jsonl`` always, W&B when ``logger=wandb``; rank 0 only.

The local file and W&B receive the same dict, so the report (which reads the file) and the
dashboards agree; the files are written through the run record (``refexp/record/``), and every name
must be in its registry (``refexp/record/metric_names.py``). W&B conventions
(``refexp/components/wandb_conventions.py``): one ``group`` per compared setting, ``job_type`` = reference strategy
(DPO: and loss), tags, the full resolved config, every registered metric declared against ``step``
(best accuracy and last drift as the runs table's summaries), final numbers in ``summary``. A resumed run
continues its W&B run (the id is kept in the run dir) and does not send W&B the steps it replays: the
earlier attempt sent them, with the same values (resumption is exact). A rerun of a completed run writes
a copy of the record until it logs a step past that run's end (``refexp/record/rerun.py``). A logging failure
is reported once and never stops training.
"""

from __future__ import annotations

import math
import os
import sys
import uuid
import warnings
from pathlib import Path
from typing import Any, Mapping

import torch

from refexp.components.wandb_conventions import SUMMARIES
from refexp.record import layout
from refexp.record.jsonl import keep_until
from refexp.record.metric_names import METRICS, unregistered
from refexp.record.metrics import MetricsWriter, read_metrics
from refexp.record.outcomes import EvalOutcomes, append_outcomes
from refexp.record.rerun import RerunRecord
from refexp.record.samples import append_samples

SAMPLES_PREFIX = "samples/"
"""Metrics keys of sample completions (``samples/eval``, ``samples/rollout``): lists of dicts, not numbers."""


def _plain(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        v = v.detach().float().item() if v.numel() == 1 else v.detach().cpu().tolist()
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else (1e308 if v > 0 else -1e308)
    return v


def check_names(names) -> None:
    """Raise ``ValueError`` naming every metric of ``names`` the registry lacks: a misspelt or renamed metric
    must not start a new series on the dashboards unnoticed."""
    bad = unregistered(names)
    if bad:
        raise ValueError(f"metric name(s) {bad} are not registered: add them (name, meaning, when logged) to "
                         f"refexp/record/metric_names.py and run `python -m refexp.record.metric_names`")


class MetricLogger:
    """Rank-0 logger. ``enabled=False`` makes every method a no-op (other ranks)."""

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        enabled: bool = True,
        wandb_cfg: Any = None,
        resolved_config: Mapping | None = None,
        run_info: Mapping | None = None,
        record: RerunRecord | None = None,
    ) -> None:
        """``record``: where the files go (the run dir when None)."""
        self.enabled = enabled
        self.run_dir = Path(run_dir)
        self._wandb = None
        self._warned = False
        self.last_step = 0  # the last step logged (status.json's last_step when a run stops early)
        if not enabled:
            return
        # metrics.jsonl mirrors what W&B received: steps up to its last one were sent by an earlier attempt
        self._sent_before = max((int(r["step"]) for r in read_metrics(self.run_dir)), default=-1)
        self._record = record or RerunRecord(self.run_dir, None)
        self._metrics = MetricsWriter(self._record.dir)
        if wandb_cfg is not None and wandb_cfg.name == "wandb":
            self._init_wandb(wandb_cfg, resolved_config or {}, run_info or {})

    # ------------------------------------------------------------------ W&B
    def _init_wandb(self, cfg: Any, config: Mapping, info: Mapping) -> None:
        try:
            import wandb

            mode = cfg.mode or os.environ.get("WANDB_MODE") or (
                "online" if os.environ.get("WANDB_API_KEY") else "offline"
            )
            id_file = layout.path(self.run_dir, layout.WANDB_ID)
            run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
            id_file.write_text(run_id)
            self._wandb = wandb.init(
                project=cfg.project,
                entity=cfg.entity,
                mode=mode,
                dir=str(self.run_dir),
                id=run_id,
                resume="allow",
                group=cfg.group or info.get("group"),
                job_type=info.get("job_type"),
                name=info.get("name"),
                tags=sorted(set(list(cfg.tags) + list(info.get("tags", [])))),
                config={**dict(config), "sweep_id": info.get("sweep_id")},
                settings=wandb.Settings(silent=True, console="off"),
            )
            self._wandb.define_metric("step")
            for m in METRICS:
                self._wandb.define_metric(m.name, step_metric="step", **({"summary": m.summary} if m.summary else {}))
            if mode == "offline":
                print(f"[refexp] W&B is offline; upload later with: wandb sync {self.run_dir / layout.WANDB_DIR}",
                      file=sys.stderr)
        except Exception as e:  # W&B problems must never stop a run
            self._warn(f"W&B init failed ({e!r}); metrics still go to {self._metrics.path}")
            self._wandb = None

    def _warn(self, msg: str) -> None:
        if not self._warned:
            warnings.warn(f"[refexp] {msg}", stacklevel=3)
            self._warned = True

    # ------------------------------------------------------------------ API
    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """One step's metrics. Not numbers: ``samples/<kind>`` keys holding lists of dicts (sample completions)
        go to ``samples.jsonl`` and a W&B table, ``EvalOutcomes`` values (per-prompt scores) to
        ``eval_outcomes.jsonl`` only. Raises ``ValueError`` on a name the registry lacks (``check_names``)."""
        if not self.enabled:
            return
        samples = {k: v for k, v in metrics.items() if k.startswith(SAMPLES_PREFIX) and isinstance(v, list)}
        outcomes = [v for v in metrics.values() if isinstance(v, EvalOutcomes)]
        row = {"step": int(step)}
        row.update({k: _plain(v) for k, v in metrics.items() if k not in samples and not isinstance(v, EvalOutcomes)})
        check_names(row)
        self.last_step = int(step)
        if self._record.protected and self.last_step > self._record.completed_at:
            self._metrics.close()  # the copy is moved into the run dir; the next rows follow it there
            self._record.promote()
            self._metrics = MetricsWriter(self._record.dir)
        self._metrics.write(row)
        if samples:
            append_samples(self._record.dir, int(step), {k[len(SAMPLES_PREFIX):]: v for k, v in samples.items()})
        if outcomes:
            append_outcomes(self._record.dir, int(step), outcomes)
        if self._wandb is not None and row["step"] > self._sent_before:
            try:
                self._wandb.log({**row, **self._wandb_tables(samples)})
            except Exception as e:
                self._warn(f"W&B log failed ({e!r})")

    def _wandb_tables(self, samples: Mapping[str, list]) -> dict:
        """``samples/<kind>`` -> a ``wandb.Table`` with one row per sample (columns from the first row)."""
        import wandb

        return {k: wandb.Table(columns=list(rows[0]), data=[[r.get(c) for c in rows[0]] for r in rows])
                for k, rows in samples.items() if rows}

    def summary(self, final: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        check_names(final)
        if self._wandb is None:
            return
        try:
            for k, v in final.items():
                if k not in SUMMARIES:  # those W&B summarises itself (best accuracy, last drift)
                    self._wandb.summary[k] = _plain(v)
        except Exception as e:
            self._warn(f"W&B summary failed ({e!r})")

    def truncate_after(self, step: int) -> None:
        """Drop what was logged after ``step`` (a resumed run re-logs it), atomically."""
        if not self.enabled:
            return
        keep = self._metrics.keep_until(step)
        self.last_step = max((int(r["step"]) for r in keep), default=0)
        for name in (layout.SAMPLES, layout.EVAL_OUTCOMES):
            if layout.path(self._record.dir, name).exists():
                keep_until(layout.path(self._record.dir, name), step)

    def close(self, exit_code: int = 0) -> None:
        if not self.enabled:
            return
        try:
            self._metrics.close()
        finally:
            if self._wandb is not None:
                try:
                    self._wandb.finish(exit_code=exit_code)
                except Exception as e:
                    self._warn(f"W&B finish failed ({e!r})")
                self._wandb = None


def peak_rss_mb() -> float:
    """Peak resident set size of this process (Linux ru_maxrss is in KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
