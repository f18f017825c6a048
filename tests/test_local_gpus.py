"""``hydra/launcher=local_gpus``: single-GPU jobs of a sweep side by side, one GPU each
(conf/hydra/launcher/local_gpus.yaml, ``refexp.runtime.launcher.claim_gpu``). The GPU choice is tested with fake
device counts; the sweep itself runs on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import refexp.runtime.launcher as launcher
from refexp.runtime.launcher import claim_gpu
from tests.helpers.configs import TINY_GRPO_OVERRIDES, TINY_RUN_OVERRIDES, compose_config, compose_tiny_run

ROOT = Path(__file__).resolve().parents[1]


def test_running_jobs_get_different_gpus(tmp_path):
    jobs = [{} for _ in range(3)]  # three worker processes' holdings
    assert claim_gpu(tmp_path, 2, first=0, held=jobs[0]) == 0
    assert claim_gpu(tmp_path, 2, first=2, held=jobs[1]) == 1  # job 2 prefers GPU 0, which job 0 holds
    with pytest.raises(RuntimeError, match="hydra.launcher.n_jobs must be at most the number of GPUs"):
        claim_gpu(tmp_path, 2, first=0, held=jobs[2])
    jobs[0]["gpu"][1].close()  # job 0's worker exits: its GPU is free again
    assert claim_gpu(tmp_path, 2, first=1, held=jobs[2]) == 0


def test_a_worker_keeps_its_gpu_for_its_next_job(tmp_path):
    held: dict = {}
    assert claim_gpu(tmp_path, 4, first=3, held=held) == 3
    assert claim_gpu(tmp_path, 4, first=0, held=held) == 3


@pytest.fixture
def side_by_side_job(monkeypatch, tmp_path):
    """A job of a local_gpus sweep (job number 1) on a node with 2 fake GPUs."""
    from hydra.core.hydra_config import HydraConfig

    hc = OmegaConf.create({"launcher": {"_target_": "hydra_plugins.hydra_joblib_launcher.joblib_launcher."
                                                    "JoblibLauncher"},
                           "sweep": {"dir": str(tmp_path / "sweep")}, "job": {"num": 1}})
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: hc))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(launcher, "_HELD", {})
    return hc


@pytest.mark.parametrize("device, want", [("auto", "cuda:1"), ("cuda", "cuda:1"), ("cpu", "cpu"),
                                          ("cuda:0", "cuda:0")])
def test_job_device(side_by_side_job, tmp_path, device, want):
    from refexp.runtime.job_placement import use_own_gpu

    cfg = compose_tiny_run(tmp_path / "run", f"training.device={device}")
    use_own_gpu(cfg)
    assert cfg.training.device == want


def test_other_launchers_leave_the_device_alone(side_by_side_job, tmp_path):
    from refexp.runtime.job_placement import use_own_gpu

    side_by_side_job.launcher._target_ = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
    cfg = compose_tiny_run(tmp_path / "run")
    use_own_gpu(cfg)
    assert cfg.training.device == "auto"


def test_launcher_config_composes():
    cfg = compose_config("run_dir=/tmp/x", "hydra/launcher=local_gpus", return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("JoblibLauncher") and cfg.hydra.launcher.n_jobs >= 1


@pytest.mark.slow
def test_two_job_sweep_runs_side_by_side(tmp_path):
    sweep = tmp_path / "sweep"
    args = [sys.executable, "-m", "refexp", "-m", "hydra/launcher=local_gpus", "hydra.launcher.n_jobs=2",
            *TINY_RUN_OVERRIDES, *TINY_GRPO_OVERRIDES, "training.steps=2", "reference=fixed,none",
            f"hydra.sweep.dir={sweep}"]
    env = dict(os.environ, OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="1")
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    statuses = sorted(sweep.glob("*/status.json"))
    assert len(statuses) == 2
    for p in statuses:
        st = json.loads(p.read_text())
        assert st["status"] == "completed" and st["last_step"] == 2, st
