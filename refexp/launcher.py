"""Start the N worker processes of one job on this machine (torch's elastic launcher, as torchrun does).

Used when a job asks for ``parallelism.nproc_per_node > 1`` but was started as a single process
(``refexp ...`` or one job of a Hydra ``-m`` sweep). Under torchrun or SLURM (one task per
GPU) the processes already exist and this is not called.

The config travels to the workers as the composed ``DictConfig`` with every interpolation resolved
in this process (so ``run_dir`` and ``${oc.env:...}`` values are this process's, and the
structured-config types survive the pickling); every worker writes to the same run dir and only
rank 0 logs. Workers are started with ``spawn``: this process may already have run torch code
(a sweep's earlier job, a test), and forking a process with live OpenMP/gloo threads can hang.
"""

from __future__ import annotations

import copy
import os
import uuid
from typing import Callable

from omegaconf import DictConfig, OmegaConf


def spawn_workers(worker: Callable[[DictConfig], dict], dcfg: DictConfig, nproc: int) -> dict:
    """Run ``worker(dcfg)`` in ``nproc`` local processes; returns rank 0's result.

    ``worker`` must be a module-level function (the spawned processes import it by name); the caller
    passes it in (``refexp.run``'s), so this module launches without depending on what runs.
    Raises torch's ``ChildFailedError`` (with the first failing rank's traceback) when a worker fails.
    """
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    resolved = copy.deepcopy(dcfg)
    OmegaConf.resolve(resolved)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"refexp-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # a free port, as `torchrun --standalone`
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
    )
    # One intra-op thread per worker unless the caller chose (torchrun's default, too).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results = elastic_launch(config, worker)(resolved)
    return results[0]
