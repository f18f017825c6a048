"""The scripts under launch/: their syntax, and the torchrun commands the multi-node ones build
(``REFEXP_DRY_LAUNCH=1`` prints the command instead of running it; SLURM's tools are faked)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for p in (ROOT / "launch").iterdir() if p.suffix in (".sh", ".sbatch"))
MULTINODE = ROOT / "launch" / "torchrun_multinode.sh"


def _bash(args: list[str], **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    full.update(REFEXP_DRY_LAUNCH="1", **env)
    return subprocess.run(["bash", *args], env=full, capture_output=True, text=True, timeout=30, cwd=ROOT)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_syntax(script):
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


def test_multinode_torchrun_command():
    out = _bash([str(MULTINODE), "run_dir=/shared/r", "algo=grpo"], NNODES="2", NODE_RANK="1",
                MASTER_ADDR="node01", RDZV_ID="job7", NPROC="4")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [
        "torchrun", "--nnodes=2", "--nproc_per_node=4", "--rdzv_backend=c10d", "--rdzv_endpoint=node01:29500",
        "--rdzv_id=job7", "--node_rank=1", "-m", "refexp", "parallelism=hsdp", "run_dir=/shared/r", "algo=grpo"]


@pytest.mark.parametrize("env, args, message", [
    ({"MASTER_ADDR": "n", "RDZV_ID": "j"}, ["run_dir=/r"], "NNODES"),
    ({"NNODES": "2", "RDZV_ID": "j"}, ["run_dir=/r"], "MASTER_ADDR"),
    ({"NNODES": "2", "MASTER_ADDR": "n"}, ["run_dir=/r"], "RDZV_ID"),
    ({"NNODES": "2", "MASTER_ADDR": "n", "RDZV_ID": "j"}, ["algo=grpo"], "run_dir=DIR"),
    ({"NNODES": "2", "MASTER_ADDR": "n", "RDZV_ID": "j", "NODE_RANK": "2"}, ["run_dir=/r"], "NODE_RANK=2"),
    ({"NNODES": "x", "MASTER_ADDR": "n", "RDZV_ID": "j"}, ["run_dir=/r"], "NNODES=x"),
    ({"NNODES": "2", "MASTER_ADDR": "n", "RDZV_ID": "j"}, ["-m", "run_dir=/r"], "-m is not for torchrun"),
])
def test_multinode_refuses_incomplete_settings(env, args, message):
    out = _bash([str(MULTINODE), *args], **env)
    assert out.returncode != 0 and message in out.stderr, out.stderr


def test_slurm_multinode_passes_job_id_first_node_and_node_rank(tmp_path):
    """srun is faked as the task of node 1 (its options written to a file); scontrol lists the allocation's
    nodes. srun gets --cpus-per-task: a job step no longer inherits it (SLURM >= 22.05)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/usr/bin/env bash\nprintf 'gpu07\\ngpu08\\n'\n")
    srun_opts = tmp_path / "srun_options"
    (bin_dir / "srun").write_text("#!/usr/bin/env bash\nwhile [[ $1 == --* ]]; do echo \"$1\" >> "
                                  f"{srun_opts}; shift; done\nSLURM_NODEID=1 exec \"$@\"\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    out = _bash([str(ROOT / "launch" / "slurm_multinode.sbatch"), "run_dir=/shared/r"],
                PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_NODELIST="gpu[07-08]", SLURM_NNODES="2",
                SLURM_JOB_ID="12345", SLURM_GPUS_ON_NODE="8", SLURM_SUBMIT_DIR=str(ROOT), SLURM_CPUS_PER_TASK="48")
    assert out.returncode == 0, out.stderr
    assert srun_opts.read_text().split() == ["--ntasks-per-node=1", "--cpus-per-task=48"]
    words = out.stdout.split()
    for want in ("--nnodes=2", "--nproc_per_node=8", "--rdzv_endpoint=gpu07:32345", "--rdzv_id=12345",
                 "--node_rank=1", "run_dir=/shared/r"):
        assert want in words, (want, words)


def test_frontier_test_resume_skips_only_sweeps_whose_runs_all_completed(tmp_path):
    """A relaunch skips the none sweep (24 runs) and start 0's ema sweep (5 betas x 4 seeds) once every run of
    each completed, and runs start 0's fixed sweep again where one of its 28 runs did not complete."""
    def runs(sweep: str, n: int, *, failed: int | None = None) -> None:
        for i in range(n):
            (tmp_path / sweep / str(i)).mkdir(parents=True)
            status = "failed" if i == failed else "completed"
            (tmp_path / sweep / str(i) / "status.json").write_text(f'{{\n  "status": "{status}"\n}}')
    runs("none", 24)
    runs("start0/ema", 20)
    runs("start0/fixed", 28, failed=27)
    out = _bash([str(ROOT / "launch" / "frontier_test.sh"), str(tmp_path)], REFEXP="echo", REFEXP_REPORT="true")
    assert out.returncode == 0, out.stderr
    launched = [line.split("hydra.sweep.dir=")[1] for line in out.stdout.splitlines()]
    assert launched[0] == f"{tmp_path}/start0/fixed"
    assert f"{tmp_path}/none" not in launched and f"{tmp_path}/start0/ema" not in launched
    assert f"{tmp_path}/start0/periodic_reset" in launched and len(launched) == 6 * 3 - 1


def test_frontier_confirm_pilot_launches_none_then_each_arm_grid_per_start(tmp_path):
    """The pilot's script (launch/arm_grids.sh with the pilot's grids): none over every start and seed first, then
    2 starts x 3 arms, each sweep over its own grid and into its own dir, extra overrides passed to each."""
    out = _bash([str(ROOT / "launch" / "frontier_confirm_pilot.sh"), str(tmp_path), "debug=x"], REFEXP="echo",
                REFEXP_REPORT="true")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 1 + 2 * 3
    assert "experiment=frontier_confirm_pilot grpo_variant=none" in lines[0] and lines[0].endswith("debug=x")
    assert f"sft.seed=1 grpo_variant=periodic_reset algo.beta=5.0,10.0,25.0,50.0,100.0 hydra.sweep.dir={tmp_path}/" \
           f"start1/periodic_reset debug=x" in lines[-1]


def test_frontier_confirm_runs_the_grids_its_plan_simulated(tmp_path):
    """launch/declared_grids.sh frontier_confirm: the starts, seeds and per-arm grids are the experiment file's
    (comparison.matched.grids, what its power plan simulated), none first, then each start's arms."""
    doc = yaml.safe_load((ROOT / "conf" / "experiment" / "frontier_confirm.yaml").read_text())
    grids = doc["comparison"]["matched"]["grids"]
    starts = len(str(doc["hydra"]["sweeper"]["params"]["sft.seed"]).split(","))
    out = _bash([str(ROOT / "launch" / "declared_grids.sh"), "frontier_confirm", str(tmp_path), "debug=x"],
                REFEXP="echo", REFEXP_REPORT="true")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "experiment=frontier_confirm grpo_variant=none" in lines[0] and lines[0].endswith("debug=x")
    arms = [a for a in doc["comparison"]["arms"] if a != "none"]
    assert len(lines) == 1 + starts * len(arms)
    for line in lines[1:]:
        arm = line.split("grpo_variant=")[1].split()[0]
        betas = [float(b) for b in line.split("algo.beta=")[1].split()[0].split(",")]
        assert betas == [float(b) for b in grids[arm]], line


def test_declared_grids_refuses_an_experiment_without_them(tmp_path):
    out = _bash([str(ROOT / "launch" / "declared_grids.sh"), "frontier_confirm_pilot", str(tmp_path)], REFEXP="echo",
                REFEXP_REPORT="true")
    assert out.returncode != 0 and "comparison.matched.grids declares no grid for fixed" in out.stderr
    assert out.stdout == ""
