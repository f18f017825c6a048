"""Which device a process uses (``titan.resolve_device``), with fake GPU counts: no GPU is needed."""

from __future__ import annotations

import pytest
import torch

from refexp import titan
from refexp.config import ConfigError
from refexp.config.runtime import TrainingConfig


@pytest.fixture
def gpus(monkeypatch):
    """``gpus(n)``: pretend n CUDA devices are visible."""
    def fake(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    return fake


@pytest.mark.parametrize("count, local_rank, want", [
    (8, 0, 0), (8, 3, 3),  # torchrun on an 8-GPU node: one GPU per local rank
    (1, 3, 0),             # one visible GPU per task (CUDA_VISIBLE_DEVICES), whatever the local rank
    (2, 3, 1),             # more ranks than GPUs: they share round-robin
])
def test_cuda_follows_the_local_rank_over_the_visible_gpus(gpus, monkeypatch, count, local_rank, want):
    gpus(count)
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    assert titan.resolve_device("cuda") == torch.device("cuda", want)
    assert titan.resolve_device("auto") == torch.device("cuda", want)


def test_cuda_n_pins_the_gpu(gpus, monkeypatch):
    gpus(4)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert titan.resolve_device("cuda:2") == torch.device("cuda", 2)
    with pytest.raises(ConfigError, match=r"training.device='cuda:4'.*cuda:0 \.\. cuda:3"):
        titan.resolve_device("cuda:4")


def test_without_gpus(gpus):
    gpus(0)
    assert titan.resolve_device("auto") == torch.device("cpu")
    for device in ("cuda", "cuda:0"):
        with pytest.raises(ConfigError, match="no CUDA device is visible"):
            titan.resolve_device(device)


@pytest.mark.parametrize("bad", ["tpu", "cuda:", "cuda:x", "cpu:0", "auto:1"])
def test_invalid_devices_are_config_errors(bad):
    with pytest.raises(ConfigError, match="training.device"):
        titan.resolve_device(bad)
    with pytest.raises(ConfigError, match="training.device"):
        TrainingConfig(device=bad)


def test_config_accepts_cuda_n():
    assert TrainingConfig(device="cuda:3").device == "cuda:3"


def test_process_group_uses_the_resolved_device(gpus, monkeypatch):
    """init_distributed pins the resolved device, not LOCAL_RANK (one GPU per task, LOCAL_RANK=3)."""
    from refexp.runtime import distributed as rdist
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: chosen.append(d))
    monkeypatch.setattr(rdist.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(rdist.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(rdist.dist, "get_world_size", lambda: 1)
    monkeypatch.setenv("LOCAL_RANK", "3")
    rdist.init_distributed(torch.device("cuda", 0), backend="gloo")
    assert chosen == [torch.device("cuda", 0)]
