"""Process group, rank-0 helpers and the tensor collectives the training loop needs.

One process is still a (1-rank gloo) process group: torchtitan's CheckpointManager calls
``dist.get_rank()`` unconditionally, and the same code path then serves 1 and N processes.
SLURM's variables are mapped to torch.distributed's when a job was started by ``srun``
rather than torchrun (hydra-submitit-launcher's one task per GPU).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    backend: str

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0


def map_slurm_env() -> None:
    """SLURM_PROCID/NTASKS/LOCALID -> RANK/WORLD_SIZE/LOCAL_RANK (+ MASTER_ADDR from the node list)."""
    if "RANK" in os.environ or "SLURM_PROCID" not in os.environ or int(os.environ.get("SLURM_NTASKS", "1")) <= 1:
        return
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
    os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
    if "MASTER_ADDR" not in os.environ:
        nodes = os.environ.get("SLURM_JOB_NODELIST", "localhost")
        # "node[01-04],x" -> "node01": the first host of a compressed list (scontrol would need a subprocess).
        first = nodes.split(",")[0]
        if "[" in first:
            prefix, rest = first.split("[", 1)
            first = prefix + rest.rstrip("]").split("-")[0].split(",")[0]
        os.environ["MASTER_ADDR"] = first
    os.environ.setdefault("MASTER_PORT", str(20000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 20000))


def launched_world_size() -> int:
    """World size set by the launcher (torchrun/SLURM), 1 when started as a plain process."""
    map_slurm_env()
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_distributed(device: torch.device, *, backend: str = "auto", timeout_s: int = 300) -> DistInfo:
    """Initialise the default process group (idempotent)."""
    map_slurm_env()
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        timeout = datetime.timedelta(seconds=timeout_s)
        if world == 1 and "MASTER_ADDR" not in os.environ:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        else:
            dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        torch.cuda.set_device(local_rank)
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, backend)


def destroy_distributed() -> None:
    if dist.is_initialized():
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


def all_reduce_sum_(t: torch.Tensor) -> torch.Tensor:
    if world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t
