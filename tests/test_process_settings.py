"""A process's torch settings from ``training`` (``refexp/runtime/process_settings.py``) and the stand-ins for an older
torch (``refexp/titan/torch_compat.py``); no GPU and no older torch needed.

``training.deterministic`` turns on torch's deterministic algorithms, cuDNN's deterministic kernels and a
fixed cuBLAS workspace, and a run applies it before it resolves its device (cuBLAS reads the workspace
setting when a process first uses it). The torch-2.11 stand-in is checked by removing the name it stands
in for, as an older torch lacks it.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed.fsdp as torch_fsdp
from torch.distributed.tensor import Shard

from refexp import titan
from refexp.config import TrainingConfig
from refexp.run import run_worker
from refexp.runtime.process_settings import (
    CUBLAS_WORKSPACE_CONFIG,
    apply_process_settings,
    compile_cache_per_kernel_selection,
)
from refexp.titan import torch_compat
from tests.helpers.configs import compose_tiny_run


@pytest.fixture
def restore_settings(monkeypatch):
    """Leave torch's process-wide flags and CUBLAS_WORKSPACE_CONFIG as the test found them."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    flags = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
             torch.backends.cudnn.benchmark, torch.get_num_threads())
    yield
    torch.use_deterministic_algorithms(flags[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = flags[1], flags[2]
    torch.set_num_threads(flags[3])


@pytest.mark.parametrize("capability", [None, "avx2", "default"])
def test_each_cpu_kernel_selection_compiles_into_its_own_cache(capability, monkeypatch):
    """Inductor's cache would hand kernels compiled under one ATEN_CPU_CAPABILITY to a process with other
    kernels (a corrupted heap or NaN): each selection other than the native one gets its own dir."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    if capability is None:
        monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    else:
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)
    compile_cache_per_kernel_selection()
    want = default_cache_dir() + (f"_{capability}" if capability else "")
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR", default_cache_dir()) == want
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/elsewhere")  # named by the user: kept
    compile_cache_per_kernel_selection()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/elsewhere"


def test_deterministic_turns_on_torchs_flags_and_a_fixed_cublas_workspace(restore_settings):
    torch.backends.cudnn.benchmark = True
    apply_process_settings(TrainingConfig(deterministic=True))
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()  # an op without one raises, naming it
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8" == CUBLAS_WORKSPACE_CONFIG


def test_the_default_turns_them_off_again_and_a_users_workspace_is_kept(restore_settings, monkeypatch):
    apply_process_settings(TrainingConfig(deterministic=True))
    apply_process_settings(TrainingConfig())  # the next run in the same process (the test suite's)
    assert not torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.deterministic
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    apply_process_settings(TrainingConfig(deterministic=True))
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


def test_num_threads_zero_keeps_torchs_default(restore_settings):
    torch.set_num_threads(1)
    apply_process_settings(TrainingConfig(num_threads=0))
    assert torch.get_num_threads() == 1
    apply_process_settings(TrainingConfig(num_threads=2))
    assert torch.get_num_threads() == 2


def test_a_run_applies_them_before_it_resolves_its_device(restore_settings, monkeypatch, tmp_path):
    seen = {}

    class Stop(Exception):
        pass

    def resolve_device(device):
        seen.update(deterministic=torch.are_deterministic_algorithms_enabled(),
                    workspace=os.environ.get("CUBLAS_WORKSPACE_CONFIG"), threads=torch.get_num_threads())
        raise Stop

    monkeypatch.setattr(titan, "resolve_device", resolve_device)
    with pytest.raises(Stop):
        run_worker(compose_tiny_run(tmp_path, "training.deterministic=true", "training.num_threads=2"))
    assert seen == {"deterministic": True, "workspace": CUBLAS_WORKSPACE_CONFIG, "threads": 2}


# ---------------------------------------------------------------- torch older than the pin
def test_the_standin_is_in_place_only_on_a_torch_older_than_2_12():
    # the pinned 2.13 has the class; torch 2.11 (the GPU check machine's, docs/gpus.md) gets the stand-in
    standing_in = torch_fsdp.DataParallelMeshDims is torch_compat.DataParallelMeshDims
    assert standing_in == (torch.torch_version.TorchVersion(torch.__version__) < "2.12")
    assert torch_compat.install() == []  # imported once: everything this torch needs is in place


def test_a_torch_without_data_parallel_mesh_dims_gets_a_standin_that_refuses_use(monkeypatch):
    monkeypatch.delattr(torch_fsdp, "DataParallelMeshDims")  # as torch 2.11 has it
    assert torch_compat.MESH_DIMS_STANDIN in torch_compat.install()
    assert torch_fsdp.DataParallelMeshDims is torch_compat.DataParallelMeshDims
    # torchtitan builds one only for spmd_backend full_dtensor / spmd_types, which torch 2.11's FSDP lacks
    with pytest.raises(RuntimeError, match=r"need torch >= 2\.12; use partial_dtensor"):
        torch_fsdp.DataParallelMeshDims(shard="dp_shard")


@pytest.mark.parametrize("version, older", [
    ("2.11.0+cu130", True), ("2.11.0", True), ("2.10.1+cpu", True), ("2.12.0.dev20260301", True),
    ("2.12.0", False), ("2.13.0+cpu", False), ("2.14.0a0+git1234", False),
])
def test_the_contiguous_gather_is_for_torch_older_than_2_12(version, older):
    assert torch_compat.gathers_uneven_shards_non_contiguous(version) is older


def test_on_an_older_torch_an_uneven_gather_comes_back_contiguous(monkeypatch):
    # what torch 2.11's Shard._to_replicate_tensor returns for 9 rows over 2 ranks: the padded gather's view
    def padded_gather(self, local_tensor, mesh, mesh_dim, current_logical_shape):
        return torch.arange(12 * 10 * 4.0).reshape(12, 10, 4).narrow(1, 0, 9)

    monkeypatch.setattr(Shard, "_to_replicate_tensor", padded_gather)
    assert torch_compat.install("2.13.0") == [] and Shard._to_replicate_tensor is padded_gather
    assert torch_compat.install("2.11.0+cu130") == [torch_compat.CONTIGUOUS_GATHER]
    assert torch_compat.install("2.11.0+cu130") == []  # not wrapped twice
    got = Shard(1)._to_replicate_tensor(None, None, 0, [12, 9, 4])
    assert got.is_contiguous() and torch.equal(got, padded_gather(None, None, None, 0, None))
