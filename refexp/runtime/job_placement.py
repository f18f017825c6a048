"""Where one job of a sweep run side by side runs: a GPU of its own (``hydra/launcher=local_gpus``) or a CPU core of
its own (``hydra/launcher=cpu_cores``), claimed before the job builds anything (refexp/run.py, ``run_from_hydra``).
Each edits the job's config in place (``training.device``, ``training.num_threads``)."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from refexp.config import ConfigError


def use_own_gpu(cfg: DictConfig) -> None:
    """Under ``hydra/launcher=local_gpus`` (jobs side by side) a single-process job on ``auto``/``cuda``
    gets a GPU of its own as ``training.device=cuda:N`` (refexp/runtime/launcher.py, ``claim_gpu``)."""
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    side_by_side = str(hc.launcher.get("_target_", "")).endswith("JoblibLauncher")
    if not side_by_side or cfg.training.device not in ("auto", "cuda") or cfg.parallelism.nproc_per_node > 1:
        return
    if not torch.cuda.is_available():
        return
    from refexp.runtime.launcher import claim_gpu

    gpu = claim_gpu(Path(hc.sweep.dir) / ".gpus", torch.cuda.device_count(), first=hc.job.num)
    cfg.training.device = f"cuda:{gpu}"


CPU_CORES_LAUNCHER = "cpu_cores"
"""The ``hydra/launcher`` option that runs a sweep's jobs one per CPU core (conf/hydra/launcher/cpu_cores.yaml)."""


def use_own_core(cfg: DictConfig) -> None:
    """Under ``hydra/launcher=cpu_cores`` a single-process job on the CPU takes a core no other job of the sweep
    holds (refexp/runtime/launcher.py, ``claim_core``), pins its process to it and runs one torch thread
    (``training.num_threads`` 0 -> 1): jobs side by side that neither share a core nor migrate between them, as
    the committed re-runs were run by hand. A job on a GPU (``use_own_gpu``) or of several processes is left as
    it is."""
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    if OmegaConf.select(hc, "runtime.choices", default={}).get("hydra/launcher") != CPU_CORES_LAUNCHER:
        return
    on_cpu = cfg.training.device == "cpu" or (cfg.training.device == "auto" and not torch.cuda.is_available())
    if not on_cpu or cfg.parallelism.nproc_per_node > 1:
        return
    if cfg.training.num_threads not in (0, 1):
        raise ConfigError(f"training.num_threads={cfg.training.num_threads} is invalid with "
                          f"hydra/launcher={CPU_CORES_LAUNCHER}: expected 0 or 1 (one single-thread job per core; "
                          f"hydra/launcher=local runs the jobs one after another with any thread count)")
    from refexp.runtime.launcher import claim_core, pin_process, usable_cores

    core = claim_core(Path(hc.sweep.dir) / ".cpus", usable_cores(), first=hc.job.num)
    pin_process({core})
    cfg.training.num_threads = 1
