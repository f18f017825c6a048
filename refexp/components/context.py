"""What every stage of a run shares: the validated config, the run dir, the device and process
group, the task, the logger. Plain data: models are built from it by ``refexp.components.models``, the
data-parallel layout comes from ``refexp.runtime.distributed`` (``dp_sum(ctx.parallel_dims, t)``, ...)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from refexp.components.metric_logger import MetricLogger
from refexp.config import RootConfig
from refexp.runtime.distributed import DistInfo


@dataclass
class RunContext:
    cfg: RootConfig
    run_dir: Path
    cache_dir: Path
    device: torch.device
    dist: DistInfo
    parallel_dims: object | None
    """torchtitan ParallelDims when world_size > 1, else None."""
    task: object
    """refexp.tasks.Task"""
    logger: MetricLogger
    completed_at: int | None = None
    """The last step of the completed run the run dir held when this invocation started (None: none): until the
    run passes it, its record is a copy (``refexp/record/rerun.py``) and no checkpoint at or before the newest
    one is written over (``Checkpointer.save``)."""
    identity: dict | None = None
    """This run's identity (``refexp/components/run_identity.py``; rank 0's holds the pins of its start and reward
    models): written into its checkpoints, and a resume refuses another run's."""
