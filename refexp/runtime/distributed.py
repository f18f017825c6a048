"""Process group, rank-0 helpers and the tensor collectives the training loop needs.

One process is still a (1-rank gloo) process group: torchtitan's CheckpointManager calls
``dist.get_rank()`` unconditionally, and the same code path then serves 1 and N processes.
SLURM's variables are mapped to torch.distributed's when a job was started by ``srun``
rather than torchrun (hydra-submitit-launcher's one task per GPU).
"""

from __future__ import annotations

import atexit
import datetime
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    backend: str

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list, without ``scontrol``: ``gpu[03-05,07],cpu1`` -> ``gpu03``,
    ``rack1-[2-3]-n[1-4]`` -> ``rack1-2-n1``, ``node7,node9`` -> ``node7``."""
    out, i = [], 0
    while i < len(nodelist) and nodelist[i] != ",":
        if nodelist[i] == "[":
            j = nodelist.index("]", i)
            out.append(nodelist[i + 1:j].split(",")[0].split("-")[0])  # zero padding is kept
            i = j + 1
        else:
            out.append(nodelist[i])
            i += 1
    return "".join(out)


def map_slurm_env(environ=None) -> None:
    """SLURM's task variables -> torch.distributed's, for processes started by ``srun`` (one task per
    GPU, as hydra-submitit-launcher does) rather than by torchrun.

    RANK <- SLURM_PROCID, WORLD_SIZE <- SLURM_STEP_NUM_TASKS (else SLURM_NTASKS), LOCAL_RANK <-
    SLURM_LOCALID, MASTER_ADDR <- the first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST),
    MASTER_PORT <- 20000 + SLURM_JOB_ID % 20000 (the same on every task of a job, different for
    jobs sharing a node). Variables already set win (torchrun inside an allocation sets RANK; a
    cluster may export MASTER_ADDR/MASTER_PORT). Does nothing for a single task. Start the tasks with
    srun: a batch script with --ntasks=N that runs refexp directly is one process, not N.
    """
    env = os.environ if environ is None else environ
    world = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or "1"
    if "RANK" in env or "SLURM_PROCID" not in env or int(world) <= 1:
        return
    env["RANK"] = env["SLURM_PROCID"]
    env["WORLD_SIZE"] = world
    env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
    if "MASTER_ADDR" not in env:
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        env["MASTER_ADDR"] = first_host(nodes) if nodes else "localhost"
    env.setdefault("MASTER_PORT", str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000))


def launched_world_size() -> int:
    """World size set by the launcher (torchrun/SLURM), 1 when started as a plain process."""
    map_slurm_env()
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_distributed(device: torch.device, *, backend: str = "auto", timeout_s: int = 300) -> DistInfo:
    """Initialise the default process group (idempotent)."""
    map_slurm_env()
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        # the device titan.resolve_device chose (not LOCAL_RANK: with one visible GPU per task it is
        # cuda:0 whatever the rank), before NCCL's communicators are made
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        timeout = datetime.timedelta(seconds=timeout_s)
        if world == 1 and "MASTER_ADDR" not in os.environ:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        else:
            dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout)
        # once per group made here; a second registration (a group destroyed and made again) is a no-op
        atexit.register(_teardown_at_exit)
        _timeouts.update(setup_s=timeout_s, now_s=timeout_s, groups=[None])
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, backend)


def set_collective_timeout(seconds: int, parallel_dims=None) -> None:
    """The timeout of every collective from now on: the default group's and each parallelism mesh's.

    ``comm.init_timeout_seconds`` covers set-up (building, loading weights, the SFT stage's lock);
    once training steps run, a rank that waits longer than ``comm.train_timeout_seconds`` in a
    collective fails instead of hanging on a peer that is gone. The barrier first, as torchtitan's
    ``set_pg_timeouts``: a fast rank must not run collectives under the short timeout while a slow one
    is still in set-up.
    """
    if world_size() == 1:
        return
    dist.barrier()
    meshes = parallel_dims.get_all_one_dimensional_meshes().values() if parallel_dims is not None else ()
    _timeouts.update(now_s=seconds, groups=[None, *(m.get_group() for m in meshes)])
    _apply_timeout(seconds)


_timeouts: dict = {"setup_s": None, "now_s": None, "groups": [None]}
"""The set-up timeout ``init_distributed`` was given, the one in force (``set_collective_timeout``) and the
groups it applies to."""


def _apply_timeout(seconds: int) -> None:
    timeout = datetime.timedelta(seconds=seconds)
    for group in _timeouts["groups"]:
        dist.distributed_c10d._set_pg_timeout(timeout, group)


@contextmanager
def setup_timeout():
    """Collectives wait up to the set-up timeout (``comm.init_timeout_seconds``) for what runs inside, then the
    ranks meet at a barrier and the timeout in force comes back. Every rank must enter it together.

    For work that may take one rank much longer than another mid-training: a first ``torch.compile`` of
    the fixed-shape decode step (``rollout.static_decode``). A rank that finishes first would wait for the
    others in the next collective under ``comm.train_timeout_seconds`` and be killed by the watchdog; a
    collective's timeout is the one in force when it is issued, so the fast rank's barrier here waits
    under the longer one. Nothing to do with one process.
    """
    if world_size() == 1 or _timeouts["setup_s"] is None or _timeouts["setup_s"] <= _timeouts["now_s"]:
        yield
        return
    _apply_timeout(_timeouts["setup_s"])
    try:
        yield
        dist.barrier()
    finally:
        _apply_timeout(_timeouts["now_s"])


_run_failed = False


def note_run_failed() -> None:
    """Record that a run of this process failed (or was preempted): the exit teardown is then skipped."""
    global _run_failed
    _run_failed = True


def _teardown_at_exit() -> None:
    """Destroy the process group while the interpreter is still whole.

    Left to interpreter finalisation, gloo's worker threads are torn down after Python's and about one
    run in six aborted a rank that had finished cleanly ("terminate called without an active exception",
    exit 134; pytorch/pytorch#190489). One process may run several jobs of a ``-m`` sweep on one group,
    so this runs once, at exit. After a failure it is skipped, as torchtitan's trainer does
    (torchtitan#1342): a teardown can wait on ranks that are gone or stuck in a collective, and the
    exit status already says the run failed.
    """
    if dist.is_initialized() and not _run_failed:
        dist.destroy_process_group()


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_rank0() -> bool:
    return rank() == 0


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def broadcast_object(obj, src: int = 0):
    """Rank ``src``'s object on every rank."""
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def decided_by_rank0(decide: Callable[[], T]) -> T:
    """``decide()`` run on rank 0 alone, and its result (or the exception it raised, re-raised) on every rank.

    For what each rank would otherwise read from the shared filesystem on its own: a cache hit, a cache key
    made of file times, which kind of checkpoint a directory holds. NFS caches file attributes per client
    (``actimeo``), so ranks on different nodes can see different answers for a while, and ranks that disagree
    on whether a collective follows (train the SFT model, compute a table) hang until the collective timeout.
    A collective: every rank must call it.
    """
    if world_size() == 1:
        return decide()
    answer = None
    if is_rank0():
        try:
            answer = (True, decide())
        except Exception as e:  # every rank raises rank 0's error, none waits for a broadcast that never comes
            answer = (False, e)
    ok, value = broadcast_object(answer)
    if not ok:
        raise value
    return value


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank when ``flag`` is True on any rank (a collective: every rank must call it).

    For decisions all ranks must take together: the collectives that follow (a checkpoint save, a
    sharded forward, another decode step) need every rank in them.
    """
    if world_size() == 1:
        return flag
    t = torch.tensor([int(flag)], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


# ---------------------------------------------------------------- the data-parallel layout
# ``parallel_dims`` is torchtitan's ParallelDims, or None for one process. Data-parallel ranks (FSDP
# shard x replicate) hold different rows of a batch; tensor-parallel peers share a data-parallel
# index and hold the same rows.
def _dp_mesh(parallel_dims):
    pd = parallel_dims
    return pd.get_mesh("batch") if hasattr(pd, "get_mesh") else pd.world_mesh["dp"]


def dp_rank_and_degree(parallel_dims) -> tuple[int, int]:
    """This rank's index among the data-parallel ranks, and their number."""
    pd = parallel_dims
    if pd is None:
        return 0, 1
    dp = pd.dp_replicate * pd.dp_shard
    if dp == 1:
        return 0, 1
    return _dp_mesh(pd).get_local_rank(), dp


def local_slice(parallel_dims, n: int) -> slice:
    """The rows of a global batch of n that this rank processes (n must divide evenly)."""
    r, d = dp_rank_and_degree(parallel_dims)
    if n % d:
        raise ValueError(f"global batch of {n} rows does not divide over {d} data-parallel ranks")
    k = n // d
    return slice(r * k, (r + 1) * k)


def dp_sum(parallel_dims, t: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """``t`` summed (or reduced by ``op``, e.g. MAX) over the data-parallel ranks (a new tensor; ``t`` itself
    when there is one)."""
    if dp_rank_and_degree(parallel_dims)[1] == 1:
        return t
    t = t.clone()
    dist.all_reduce(t, op=op, group=_dp_mesh(parallel_dims).get_group())
    return t


def dp_mean_metrics(parallel_dims, metrics: dict[str, float], weights: dict[str, float] | None = None, *,
                    device: torch.device) -> dict[str, float]:
    """Per-rank means -> the global batch's: ``sum_r w_r m_r / sum_r w_r`` for each key of ``weights``
    (the rank's rows or tokens behind its mean ``m_r``), an equal-weight mean of every metric when
    ``weights`` is None. Keys outside ``weights`` are returned as they are (e.g. timings).

    A plain mean of rank means is only the global mean when ranks hold equal counts; weighted by
    the counts it equals the single-process value whatever the split.
    """
    d = dp_rank_and_degree(parallel_dims)[1]
    if d == 1:
        return metrics
    keys = sorted(metrics if weights is None else weights)
    w = torch.tensor([1.0 if weights is None else float(weights[k]) for k in keys], dtype=torch.float64,
                     device=device)
    v = torch.tensor([metrics[k] for k in keys], dtype=torch.float64, device=device)
    mean = dp_sum(parallel_dims, v * w) / dp_sum(parallel_dims, w).clamp(min=1e-12)
    return {**metrics, **{k: float(x) for k, x in zip(keys, mean)}}


def padded_share(parallel_dims, n: int) -> tuple[list[int], int]:
    """This data-parallel rank's contiguous block of ``n`` row ids, padded with row 0 to ``ceil(n / dp)``
    ids on every rank: (ids, number of real ids at the front).

    For measurements over a set that need not divide evenly: every rank then makes the same number
    of same-sized sharded forward calls (FSDP/TP collectives), and drops the padding's results
    before the ranks' sums are combined (``dp_sum``). Tensor-parallel peers get the same ids.
    """
    r, d = dp_rank_and_degree(parallel_dims)
    k = -(-n // d)
    ids = list(range(r * k, min(n, (r + 1) * k)))
    return ids + [0] * (k - len(ids)), len(ids)
