"""What torchtitan 0.3.0 and refexp need from a torch older than the pinned 2.13 (docs/torchtitan-notes.md §17).

refexp is pinned to torch 2.13.0, but a GPU machine may come with an older CUDA build that cannot be
replaced (torch 2.11 with CUDA 13 on the project's GPU check machine, docs/gpus.md). Two things differ
there, each fixed only where it is missing, so on torch >= 2.12 nothing changes:

- ``torch.distributed.fsdp.DataParallelMeshDims`` (new in 2.12) is imported by torchtitan at module level:
  a stand-in lets the import work. torchtitan builds one only for ``spmd_backend`` full_dtensor or
  spmd_types, which need 2.12's ``fully_shard(dp_mesh_dims=...)``; refexp's ``partial_dtensor`` never does.
- A DTensor gathered from an uneven ``Shard`` (TP's sequence-parallel activations when the sequence length
  is not a multiple of the TP degree) comes back from 2.11 as a non-contiguous view of the padded gather,
  and ``F.linear`` on it fails (``view size is not compatible with input tensor's size and stride``).
  2.13's gather is contiguous; on an older torch the gathered tensor is made contiguous (a copy, only
  when uneven).

Installed when this module is imported, which ``refexp/titan/__init__.py`` does before any module that
imports torchtitan.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import torch.distributed.fsdp as torch_fsdp
from torch.distributed.tensor import Shard
from torch.torch_version import TorchVersion

# what each patch is called in install()'s answer
MESH_DIMS_STANDIN = "torch.distributed.fsdp.DataParallelMeshDims stand-in"
CONTIGUOUS_GATHER = "Shard._to_replicate_tensor made contiguous"


@dataclasses.dataclass
class DataParallelMeshDims:
    """Stand-in for torch >= 2.12's ``torch.distributed.fsdp.DataParallelMeshDims``: importable, and refused
    when built, so full_dtensor/spmd_types fail here with a reason rather than inside FSDP."""

    shard: str | tuple[str, ...] | None = None
    replicate: str | tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        raise RuntimeError(
            f"torch {torch.__version__} has no fully_shard(dp_mesh_dims=...): parallelism.spmd_backend "
            "full_dtensor and spmd_types need torch >= 2.12; use partial_dtensor (docs/torchtitan-notes.md §17)")


def gathers_uneven_shards_non_contiguous(version: str) -> bool:
    """Whether torch ``version`` returns a non-contiguous local tensor from an uneven Shard -> Replicate
    (torch 2.11 does, 2.13 does not; 2.12 is taken to be fixed with the API torchtitan 0.3.0 was built on)."""
    return TorchVersion(version) < "2.12"


def _contiguous_result(gather):
    @functools.wraps(gather)
    def contiguous_gather(*args, **kwargs):
        return gather(*args, **kwargs).contiguous()

    contiguous_gather.refexp_contiguous = True
    return contiguous_gather


def install(version: str = torch.__version__) -> list[str]:
    """Put each fix this torch needs in place; returns the ones it installed now. Idempotent."""
    installed = []
    if not hasattr(torch_fsdp, "DataParallelMeshDims"):
        torch_fsdp.DataParallelMeshDims = DataParallelMeshDims
        installed.append(MESH_DIMS_STANDIN)
    gather = Shard._to_replicate_tensor
    if gathers_uneven_shards_non_contiguous(version) and not getattr(gather, "refexp_contiguous", False):
        Shard._to_replicate_tensor = _contiguous_result(gather)
        installed.append(CONTIGUOUS_GATHER)
    return installed


# At import: refexp/titan/__init__.py imports this module before any module that imports torchtitan.
install()
