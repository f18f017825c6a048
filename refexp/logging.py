"""Metrics out: ``<run dir>/metrics.jsonl`` always, W&B when ``logger=wandb``; rank 0 only.

The local file and W&B receive the same dict, so the report (which reads the file) and the
dashboards agree. W&B conventions (``refexp/wandb_conventions.py``, README "Weights & Biases"): one
``group`` per compared setting, ``job_type`` = reference strategy (DPO: and loss), tags, the full
resolved config, step metrics declared with ``define_metric`` (best accuracy and last drift as the
runs table's summaries), final numbers in ``summary``. A resumed run continues its W&B run (the id is
kept in the run dir) and does not send W&B the steps it replays: the earlier attempt sent them, with
the same values (resumption is exact). A logging failure is reported once and never stops training.
"""

from __future__ import annotations

import json
import math
import os
import sys
import uuid
import warnings
from pathlib import Path
from typing import Any, Mapping

import torch

from refexp.io import write_text_atomic
from refexp.wandb_conventions import SUMMARIES

SAMPLES_PREFIX = "samples/"
"""Metrics keys of sample completions (``samples/eval``, ``samples/rollout``): lists of dicts, not numbers."""


def _plain(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        v = v.detach().float().item() if v.numel() == 1 else v.detach().cpu().tolist()
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else (1e308 if v > 0 else -1e308)
    return v


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """All complete lines of a metrics.jsonl (a torn last line from a kill is skipped)."""
    rows = []
    p = Path(path)
    if not p.exists():
        return rows
    for line in p.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _keep_until(path: Path, step: int) -> list[dict]:
    """Rewrite a jsonl file of logged rows (atomically) without the rows after ``step``; returns the kept rows."""
    keep = [r for r in read_metrics(path) if r.get("step", 0) <= step]
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in keep))
    return keep


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
    ) -> None:
        self.enabled = enabled
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.jsonl"
        self.samples_path = self.run_dir / "samples.jsonl"
        self._wandb = None
        self._warned = False
        self.last_step = 0  # the last step logged (status.json's last_step when a run stops early)
        if not enabled:
            return
        # metrics.jsonl mirrors what W&B received: steps up to its last one were sent by an earlier attempt
        self._sent_before = max((int(r.get("step", -1)) for r in read_metrics(self.path)), default=-1)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", buffering=1)  # line-buffered: a kill loses at most one line
        if wandb_cfg is not None and wandb_cfg.name == "wandb":
            self._init_wandb(wandb_cfg, resolved_config or {}, run_info or {})

    # ------------------------------------------------------------------ W&B
    def _init_wandb(self, cfg: Any, config: Mapping, info: Mapping) -> None:
        try:
            import wandb

            mode = cfg.mode or os.environ.get("WANDB_MODE") or (
                "online" if os.environ.get("WANDB_API_KEY") else "offline"
            )
            id_file = self.run_dir / "wandb_id"
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
            for prefix in ("loss", "reward", "rewards", "kl", "eval", "ref", "perf", "mem", "clip", "logps",
                           "policy", "train", "sft", "orpo", "optim", "refcache"):
                self._wandb.define_metric(f"{prefix}/*", step_metric="step")
            for key, summary in SUMMARIES.items():
                self._wandb.define_metric(key, step_metric="step", summary=summary)
            if mode == "offline":
                print(f"[refexp] W&B is offline; upload later with: wandb sync {self.run_dir / 'wandb'}",
                      file=sys.stderr)
        except Exception as e:  # W&B problems must never stop a run
            self._warn(f"W&B init failed ({e!r}); metrics still go to {self.path}")
            self._wandb = None

    def _warn(self, msg: str) -> None:
        if not self._warned:
            warnings.warn(f"[refexp] {msg}", stacklevel=3)
            self._warned = True

    # ------------------------------------------------------------------ API
    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """One step's metrics; ``samples/<kind>`` keys holding lists of dicts (sample completions) go to
        ``samples.jsonl`` and a W&B table instead of ``metrics.jsonl``."""
        if not self.enabled:
            return
        samples = {k: v for k, v in metrics.items() if k.startswith(SAMPLES_PREFIX) and isinstance(v, list)}
        row = {"step": int(step)}
        self.last_step = int(step)
        row.update({k: _plain(v) for k, v in metrics.items() if k not in samples})
        self._file.write(json.dumps(row) + "\n")
        if samples:
            self._write_samples(int(step), samples)
        if self._wandb is not None and row["step"] > self._sent_before:
            try:
                self._wandb.log({**row, **self._wandb_tables(samples)})
            except Exception as e:
                self._warn(f"W&B log failed ({e!r})")

    def _write_samples(self, step: int, samples: Mapping[str, list]) -> None:
        with open(self.samples_path, "a") as f:
            for key, rows in samples.items():
                for r in rows:
                    f.write(json.dumps({"step": step, "kind": key[len(SAMPLES_PREFIX):], **r}) + "\n")

    def _wandb_tables(self, samples: Mapping[str, list]) -> dict:
        """``samples/<kind>`` -> a ``wandb.Table`` with one row per sample (columns from the first row)."""
        import wandb

        return {k: wandb.Table(columns=list(rows[0]), data=[[r.get(c) for c in rows[0]] for r in rows])
                for k, rows in samples.items() if rows}

    def summary(self, final: Mapping[str, Any]) -> None:
        if not self.enabled or self._wandb is None:
            return
        try:
            for k, v in final.items():
                if k not in SUMMARIES:  # those W&B summarises itself (best accuracy, last drift)
                    self._wandb.summary[k] = _plain(v)
        except Exception as e:
            self._warn(f"W&B summary failed ({e!r})")

    def truncate_after(self, step: int) -> None:
        """Drop lines logged after ``step`` (a resumed run re-logs them), atomically."""
        if not self.enabled:
            return
        self._file.close()
        keep = _keep_until(self.path, step)
        self.last_step = max((int(r.get("step", 0)) for r in keep), default=0)
        if self.samples_path.exists():
            _keep_until(self.samples_path, step)
        self._file = open(self.path, "a", buffering=1)

    def close(self, exit_code: int = 0) -> None:
        if not self.enabled:
            return
        try:
            self._file.close()
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
