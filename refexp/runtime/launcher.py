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
import fcntl
import os
import signal
import threading
import uuid
from pathlib import Path
from typing import Callable

from omegaconf import DictConfig, OmegaConf


def spawn_workers(worker: Callable[[DictConfig], dict], dcfg: DictConfig, nproc: int, *,
                  on_failure: Callable[[str], None] | None = None) -> dict:
    """Run ``worker(dcfg)`` in ``nproc`` local processes; returns rank 0's result.

    ``worker`` must be a module-level function (the spawned processes import it by name); the caller
    passes it in (``refexp.run``'s), so this module launches without depending on what runs.
    Raises torch's ``ChildFailedError`` (with the first failing rank's traceback) when a worker fails,
    after calling ``on_failure(description of the first failure)``. When one worker fails, torch's agent
    stops the others (SIGTERM, SIGKILL 30 s later: a rank blocked in a collective never sees SIGTERM).
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
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
    # torch's agent sets its own SIGTERM/SIGINT/SIGHUP/SIGQUIT handlers in this process (they raise its
    # SignalException) and leaves them set: put back the ones found, so a later Ctrl-C in this process (a
    # sweep's next job, a caller's own handler: refexp/runtime/stop_signals.py) is what it was before.
    handlers = _signal_handlers()
    try:
        results = elastic_launch(config, worker)(resolved)
    except ChildFailedError as e:
        if on_failure is not None:
            on_failure(describe_failure(e))
        raise
    finally:
        _restore_signal_handlers(handlers)
    return results[0]


_AGENT_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
                       if hasattr(signal, name))
"""The signals torch's elastic agent handles in the launching process
(``torch.distributed.elastic.multiprocessing.api.PContext.start``)."""


def _signal_handlers() -> dict:
    if threading.current_thread() is not threading.main_thread():
        return {}  # only the main thread sets handlers, and torch's agent sets none from another
    return {s: signal.getsignal(s) for s in _AGENT_SIGNALS}


def _restore_signal_handlers(handlers: dict) -> None:
    for s, handler in handlers.items():
        if handler is not None:
            signal.signal(s, handler)


def describe_failure(error) -> str:
    """The first failing rank of a ``ChildFailedError`` in one line: its exception, or its exit signal."""
    rank, failure = error.get_first_failure()
    return f"rank {rank} exited with code {failure.exitcode}: {failure.message}"


# ---------------------------------------------------------------- single-device jobs side by side
_HELD: dict = {}
"""What this process holds (``claim_gpu``, ``claim_core``): per kind, the index and the open, locked lock file."""


def claim_gpu(lock_dir: Path, n_gpus: int, *, first: int = 0, held: dict | None = None) -> int:
    """A GPU of this node that no other job of the sweep holds, kept by this process until it exits.

    Jobs of a ``hydra/launcher=local_gpus`` sweep run side by side in joblib's worker processes
    (conf/hydra/launcher/local_gpus.yaml). ``hydra.job.num % n_gpus`` alone would put two running jobs
    on one GPU as soon as jobs finish out of order, so each GPU has a lock file under ``lock_dir`` (the
    sweep dir) and a job takes the first free one, trying GPU ``first % n_gpus`` first. A worker keeps
    its GPU for its later jobs: its process group and CUDA context are bound to it. The lock is freed
    by the OS when the process ends, however it ends.
    """
    return _claim(lock_dir, "gpu", list(range(n_gpus)), first=first, held=held,
                  too_few="hydra.launcher.n_jobs must be at most the number of GPUs")


def claim_core(lock_dir: Path, cores: list[int], *, first: int = 0, held: dict | None = None) -> int:
    """A CPU core of ``cores`` that no other job of the sweep holds, kept by this process until it exits: the
    jobs of a ``hydra/launcher=cpu_cores`` sweep, one per core, as ``claim_gpu``'s are one per GPU."""
    return _claim(lock_dir, "cpu", cores, first=first, held=held,
                  too_few="hydra.launcher.n_jobs must be at most the number of cores this process may use")


def _claim(lock_dir: Path, kind: str, devices: list[int], *, first: int, held: dict | None, too_few: str) -> int:
    held = _HELD if held is None else held
    if kind in held:
        return held[kind][0]
    lock_dir.mkdir(parents=True, exist_ok=True)
    for k in range(len(devices)):
        device = devices[(first + k) % len(devices)]
        f = open(lock_dir / f"{kind}-{device}.lock", "w")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            continue
        held[kind] = (device, f)
        return device
    raise RuntimeError(f"all {len(devices)} {kind.upper()}s are held by other jobs of this sweep ({lock_dir}): "
                       f"{too_few}")


def usable_cores() -> list[int]:
    """The CPU cores this process may run on (its affinity, which a container or ``taskset`` may narrow)."""
    return sorted(os.sched_getaffinity(0))


def pin_process(cores: set[int]) -> None:
    """Pin every thread of this process to ``cores`` (Linux affinity is per thread, and threads started before
    the call, OpenMP's or gloo's, would otherwise keep theirs); threads started later inherit it."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile
            pass
