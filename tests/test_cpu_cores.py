"""``hydra/launcher=cpu_cores``: the jobs of a sweep side by side on a CPU machine, one single-thread job per core,
each pinned to a core no other job holds (conf/hydra/launcher/cpu_cores.yaml,
``refexp.runtime.job_placement.use_own_core``, ``refexp.runtime.launcher.claim_core``), as the committed experiments
run by default."""

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
from refexp.config import ConfigError
from refexp.runtime.launcher import claim_core
from tests.helpers.configs import (
    TINY_GRPO_OVERRIDES,
    TINY_RUN_OVERRIDES,
    compose_config,
    compose_tiny_run,
    conf_options,
)

ROOT = Path(__file__).resolve().parents[1]


def test_running_jobs_get_different_cores_and_a_worker_keeps_its_own(tmp_path):
    jobs = [{} for _ in range(3)]  # three worker processes' holdings
    assert claim_core(tmp_path, [4, 6], first=1, held=jobs[0]) == 6
    assert claim_core(tmp_path, [4, 6], first=1, held=jobs[1]) == 4  # job 1 prefers core 6, which job 0 holds
    with pytest.raises(RuntimeError, match="n_jobs must be at most the number of cores"):
        claim_core(tmp_path, [4, 6], first=0, held=jobs[2])
    assert claim_core(tmp_path, [4, 6], first=0, held=jobs[0]) == 6  # its next job: the same core


@pytest.fixture
def cpu_cores_job(monkeypatch, tmp_path):
    """A job (number 1) of a cpu_cores sweep on a machine without a GPU; the test process's affinity is put back."""
    from hydra.core.hydra_config import HydraConfig

    hc = OmegaConf.create({"launcher": {"_target_": "hydra_plugins.hydra_joblib_launcher.joblib_launcher."
                                                    "JoblibLauncher"},
                           "runtime": {"choices": {"hydra/launcher": "cpu_cores"}},
                           "sweep": {"dir": str(tmp_path / "sweep")}, "job": {"num": 1}})
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: hc))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(launcher, "_HELD", {})
    pinned: list = []
    monkeypatch.setattr(launcher, "pin_process", pinned.append)  # the test process keeps its cores
    return hc, pinned


def test_a_cpu_job_is_pinned_to_one_core_with_one_thread(cpu_cores_job, tmp_path):
    from refexp.runtime.job_placement import use_own_core

    cfg = compose_tiny_run(tmp_path / "run", "training.num_threads=0")
    use_own_core(cfg)
    cores = launcher.usable_cores()
    assert cfg.training.num_threads == 1
    assert cpu_cores_job[1] == [{cores[1 % len(cores)]}]  # job 1 tries core 1 first


@pytest.mark.parametrize("override", ["training.device=cuda:0", "parallelism.nproc_per_node=2"])
def test_a_gpu_or_multi_process_job_is_left_alone(cpu_cores_job, tmp_path, override):
    from refexp.runtime.job_placement import use_own_core

    cfg = compose_tiny_run(tmp_path / "run", "training.num_threads=0", override)
    use_own_core(cfg)
    assert cfg.training.num_threads == 0 and cpu_cores_job[1] == []


def test_other_launchers_leave_threads_and_cores_alone(cpu_cores_job, tmp_path):
    from refexp.runtime.job_placement import use_own_core

    cpu_cores_job[0].runtime.choices["hydra/launcher"] = "local_gpus"
    cfg = compose_tiny_run(tmp_path / "run", "training.num_threads=0")
    use_own_core(cfg)
    assert cfg.training.num_threads == 0 and cpu_cores_job[1] == []


def test_more_threads_than_the_core_is_refused(cpu_cores_job, tmp_path):
    from refexp.runtime.job_placement import use_own_core

    with pytest.raises(ConfigError, match="training.num_threads=2 is invalid with hydra/launcher=cpu_cores"):
        use_own_core(compose_tiny_run(tmp_path / "run", "training.num_threads=2"))


def test_pinning_moves_every_thread_of_the_process():
    import threading

    before = os.sched_getaffinity(0)
    started, stop = threading.Event(), threading.Event()
    worker = threading.Thread(target=lambda: (started.set(), stop.wait()))
    worker.start()
    started.wait()
    try:
        core = min(before)
        launcher.pin_process({core})
        assert os.sched_getaffinity(worker.native_id) == {core} and os.sched_getaffinity(0) == {core}
    finally:
        launcher.pin_process(before)
        stop.set()
        worker.join()


def test_every_experiment_runs_on_cpu_cores_and_the_command_line_wins():
    for experiment in conf_options("experiment"):  # a new experiment runs side by side too
        cfg = compose_config("run_dir=/tmp/x", f"experiment={experiment}", return_hydra_config=True)
        assert cfg.hydra.runtime.choices["hydra/launcher"] == "cpu_cores"
        assert cfg.hydra.launcher.n_jobs == (torch.cuda.device_count() or len(os.sched_getaffinity(0)))
    cfg = compose_config("run_dir=/tmp/x", "experiment=quickstart", "hydra/launcher=local", return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("BasicLauncher")


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or torch.cuda.is_available(),
                    reason="two jobs on distinct cores need a CPU machine with two usable cores")
def test_a_two_job_sweep_runs_each_job_on_its_own_core_with_one_thread(tmp_path):
    sweep = tmp_path / "sweep"
    args = [sys.executable, "-m", "refexp", "-m", "hydra/launcher=cpu_cores", "hydra.launcher.n_jobs=2",
            *TINY_RUN_OVERRIDES, "training.num_threads=0", *TINY_GRPO_OVERRIDES, "training.steps=1",
            "reference=fixed,none", f"sft.cache_dir={tmp_path / 'cache'}", f"hydra.sweep.dir={sweep}"]
    env = dict(os.environ, HYDRA_FULL_ERROR="1")
    env.pop("OMP_NUM_THREADS", None)  # the launcher, not the environment, makes the jobs single-threaded
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    statuses = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/status.json"))]
    assert [s["status"] for s in statuses] == ["completed", "completed"]
    assert [s["cpus"]["threads"] for s in statuses] == [1, 1]
    affinities = [tuple(s["cpus"]["affinity"]) for s in statuses]
    assert all(len(a) == 1 for a in affinities) and len(set(affinities)) == 2, affinities
