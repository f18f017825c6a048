"""Start the N worker processes of one job on this machine (torch's elastic launcher, as torchrun does).

Used when a job asks for ``parallelism.nproc_per_node > 1`` but was started as a single process
(``refexp ...`` or one job of a Hydra ``-m`` sweep). Under torchrun or SLURM (one task per
GPU) the processes already exist and this is not called. The resolved config travels to the
workers as a plain container; every worker writes to the same run dir (only rank 0 logs).
"""

from __future__ import annotations

import os
import socket
import uuid

from omegaconf import DictConfig, OmegaConf


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(container: dict) -> dict:
    from refexp.config import register_configs
    from refexp.run import run_worker

    register_configs()
    return run_worker(OmegaConf.create(container))


def spawn_workers(dcfg: DictConfig, nproc: int) -> dict:
    """Run ``run_worker`` in ``nproc`` local processes; returns rank 0's final metrics."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    container = OmegaConf.to_container(dcfg, resolve=True)
    port = _free_port()
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"refexp-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{port}",
        max_restarts=0,
        monitor_interval=0.5,
        start_method="spawn",
    )
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results = elastic_launch(config, _worker)(container)
    return results[0]
