"""Multi-process runs (gloo on CPU) give the single-process numbers: same seed, same global batch.

Every launch below is a real command line (``torchrun --standalone --nproc_per_node=2 -m refexp ...``
or ``refexp ... parallelism.nproc_per_node=2``, which spawns its own workers); the single-process
baselines run in this process (``refexp.run.run``), one intra-op thread everywhere. Start-up
(each process's imports) dominates, so one torchrun launch runs several jobs as a Hydra
``-m`` sweep (each rank runs the jobs in order on one process group).

The task is the embedded arithmetic with 1-digit operands and a 120-step SFT model: it gets about
a third right, so GRPO's rewards, advantages and updates are non-trivial in a 4-step run.

Checked: GRPO (fsdp, tp) x (periodic reset every 2 steps, EMA alpha=0.5 every step), DPO (fsdp,
tp) with an EMA reference, the SFT stage trained on 2 ranks (with W&B offline: one W&B run, rank
0's), the run dir the ranks agree on, and a ``-m`` sweep of 2-process jobs (fixed, none). Every
logged metric except timings, memory and thresholded counts (``eval/accuracy``, ``rewards/accuracies``: a tie
in another summation order flips them by one unit) must match within SAME_METRICS_TOL: ``loss/*``,
``reward/*``, ``kl/ref``, ``kl/init``, ``ref/*``, ``optim/grad_norm``, ... Also on 4 processes
(``hsdp``, ``fsdp_tp``), and an FSDP checkpoint resumed on one process.

Fast (no processes started): SLURM variable mapping, and parallelism degrees checked against the
world size and the model before anything is built.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from refexp.config import ConfigError
from refexp.run import run, validate
from refexp.runtime import distributed as rdist
from tests.helpers.configs import SMALL_DPO_OVERRIDES, SMALL_GRPO_OVERRIDES, SMALL_RUN_OVERRIDES, compose_small_run
from tests.helpers.processes import free_slurm_job_id
from tests.helpers.runs import (
    LAUNCH_TIMEOUT_S,
    assert_same_metrics,
    assert_same_row,
    launch,
    metrics_by_step,
    run_status,
    torchrun,
)

pytestmark = pytest.mark.numerics  # tests/README.md: run under other CPU kernels too

slow = pytest.mark.slow

# A short SFT stage for the 2-rank check: over 120 steps float rounding differences (1e-7) grow
# until the trajectories part (the tiny model's SFT is chaotic at this learning rate).
SFT = ["algo=sft", "sft.steps=12", "sft.eval_every=6"]
REFS = {
    "periodic_reset": ["reference=periodic_reset", "reference.reset_every=2"],
    "ema": ["reference=ema", "reference.alpha=0.5"],
    "fixed": ["reference=fixed"],
    "none": ["reference=none"],
}


# ---------------------------------------------------------------- single-process baselines
@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The session's refexp cache (as conftest's) and single-process baselines run in this process."""
    base = tmp_path_factory.getbasetemp()
    cache = base / "refexp-cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REFEXP_CACHE", str(cache))
        out = tmp_path_factory.mktemp("single")
        for ref in ("periodic_reset", "ema", "fixed", "none"):
            run(compose_small_run(out / f"grpo-{ref}", *SMALL_GRPO_OVERRIDES, *REFS[ref]))
        run(compose_small_run(out / "dpo-ema", *SMALL_DPO_OVERRIDES, *REFS["ema"]))
        run(compose_small_run(out / "sft", *SFT))
        run(compose_small_run(out / "grpo-periodic_reset-6", *SMALL_GRPO_OVERRIDES, *REFS["periodic_reset"],
                              "training.steps=6"))
    return {"cache": cache, "single": out, "tmp": tmp_path_factory.mktemp("multi")}


@slow
def test_baselines_have_signal(env):
    """The comparison means something: rewards vary, the policy moves, the references move."""
    rows = metrics_by_step(env["single"] / "grpo-periodic_reset")
    assert any(0 < rows[s]["reward/mean"] < 1 for s in (1, 2, 3, 4))
    assert rows[4]["kl/init"] > 1e-4 and rows[4]["ref/version"] == 2
    assert rows[3]["kl/ref"] == pytest.approx(0.0, abs=1e-6)  # sampled right after the reset at step 2
    ema = metrics_by_step(env["single"] / "grpo-ema")
    assert ema[4]["ref/version"] == 4 and ema[4]["kl/ref"] > 1e-6
    dpo = metrics_by_step(env["single"] / "dpo-ema")
    assert dpo[4]["ref/version"] == 4 and dpo[2]["loss/total"] != pytest.approx(dpo[1]["loss/total"])


# ---------------------------------------------------------------- torchrun
@slow
def test_grpo_fsdp_and_tp_match_single_process(env):
    """Two torchrun launches (one per strategy: each takes only its own fields), 4 jobs: GRPO x {fsdp, tp}
    x {periodic reset, EMA}."""
    sweep = env["tmp"] / "grpo"
    for ref in ("periodic_reset", "ema"):
        torchrun("-m", *SMALL_RUN_OVERRIDES, *SMALL_GRPO_OVERRIDES, *REFS[ref], "parallelism=fsdp,tp",
                 f"hydra.sweep.dir={sweep}",
                 "hydra.sweep.subdir=${parallelism.tensor_parallel_degree}-${reference.name}", cache=env["cache"])
    for tp, layout in ((1, "fsdp"), (2, "tp")):
        for ref in ("periodic_reset", "ema"):
            run_dir = sweep / f"{tp}-{ref}"
            assert run_status(run_dir)["status"] == "completed", (layout, ref)
            assert_same_metrics(run_dir, env["single"] / f"grpo-{ref}", other_order=True)

    # the FSDP run's checkpoint (step 4, with the moved reference) resumes on one process (DCP reshards)
    run_dir = sweep / "1-periodic_reset"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REFEXP_CACHE", str(env["cache"]))
        run(compose_small_run(run_dir, *SMALL_GRPO_OVERRIDES, *REFS["periodic_reset"], "training.steps=6"))
    got, want = metrics_by_step(run_dir), metrics_by_step(env["single"] / "grpo-periodic_reset-6")
    for step in (5, 6):
        assert_same_row(got[step], want[step], other_order=True, where=f"step {step}")


@slow
def test_four_processes_hsdp_and_fsdp_tp(env):
    """4 processes: HSDP (2 replicas x FSDP 2) and FSDP 2 x TP 2, one launch."""
    sweep = env["tmp"] / "grpo4"
    torchrun("-m", *SMALL_RUN_OVERRIDES, *SMALL_GRPO_OVERRIDES, *REFS["periodic_reset"], "parallelism=hsdp,fsdp_tp",
             f"hydra.sweep.dir={sweep}", cache=env["cache"], nproc=4)
    for job in ("0", "1"):
        assert_same_metrics(sweep / job, env["single"] / "grpo-periodic_reset", other_order=True)


@slow
def test_dpo_fsdp_and_tp_match_single_process(env):
    sweep = env["tmp"] / "dpo"
    torchrun("-m", *SMALL_RUN_OVERRIDES, *SMALL_DPO_OVERRIDES, *REFS["ema"], "parallelism=fsdp,tp",
             f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=${parallelism.tensor_parallel_degree}",
             cache=env["cache"])
    for sub in ("1", "2"):
        assert_same_metrics(sweep / sub, env["single"] / "dpo-ema", other_order=True)


@slow
def test_sft_on_two_ranks_one_run_dir_one_logger(env):
    """The SFT stage trained by 2 FSDP ranks follows the single-process curve; the ranks' Hydra dirs
    differ on purpose (``rank${oc.env:RANK}``) and rank 0's wins; only rank 0 starts W&B."""
    out = env["tmp"] / "sft"
    torchrun(*SMALL_RUN_OVERRIDES, *SFT, "parallelism=fsdp", f"hydra.run.dir={out}/rank${{oc.env:RANK}}",
             "logger=wandb", "logger.mode=offline", cache=env["cache"] / "2")
    assert run_status(out / "rank0")["status"] == "completed"
    assert not (out / "rank1").exists(), "rank 1 kept its own run dir"
    assert_same_metrics(out / "rank0", env["single"] / "sft", other_order=True)
    assert len(list(out.glob("rank0/wandb/offline-run-*"))) == 1


# ---------------------------------------------------------------- refexp spawns its workers
@slow
def test_sweep_of_two_process_jobs(env):
    """``refexp -m reference=fixed,none parallelism=fsdp``: each job starts its 2 workers itself."""
    sweep = env["tmp"] / "sweep"
    launch([sys.executable, "-m", "refexp", "-m", *SMALL_RUN_OVERRIDES, *SMALL_GRPO_OVERRIDES, "reference=fixed,none",
            "parallelism=fsdp", "parallelism.nproc_per_node=2", f"hydra.sweep.dir={sweep}"], env["cache"],
           timeout=2 * LAUNCH_TIMEOUT_S)
    for job, ref in (("0", "fixed"), ("1", "none")):
        assert run_status(sweep / job)["status"] == "completed"
        assert_same_metrics(sweep / job, env["single"] / f"grpo-{ref}", other_order=True)


# ---------------------------------------------------------------- SLURM: one task per GPU, started by srun
SLURM_TASK = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "4242",
              "SLURM_JOB_NODELIST": "gpu-a[07-08,11],gpu-b3"}


def test_slurm_variables_map_to_torch_distributed():
    env = dict(SLURM_TASK)
    rdist.map_slurm_env(env)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("5", "8", "1")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("gpu-a07", str(20000 + 4242))
    # srun's step variables win over the allocation's; a cluster's MASTER_* are kept
    env = dict(SLURM_TASK, SLURM_STEP_NUM_TASKS="4", SLURM_STEP_NODELIST="n[3-4]", MASTER_PORT="1234")
    rdist.map_slurm_env(env)
    assert (env["WORLD_SIZE"], env["MASTER_ADDR"], env["MASTER_PORT"]) == ("4", "n3", "1234")


@pytest.mark.parametrize("env", [
    dict(SLURM_TASK, RANK="2", WORLD_SIZE="4"),  # torchrun inside an allocation: its variables stay
    dict(SLURM_TASK, SLURM_NTASKS="1"),  # a single task: plain process
    {"SLURM_JOB_ID": "1"},  # an allocation, but not a task of srun
])
def test_slurm_mapping_leaves_other_launches_alone(env):
    before = dict(env)
    rdist.map_slurm_env(env)
    assert env == before


@pytest.mark.parametrize("nodelist,first", [("node7,node9", "node7"), ("n[1]", "n1"),
                                            ("rack1-[2-3]-n[1-4]", "rack1-2-n1"), ("localhost", "localhost")])
def test_first_host_of_a_slurm_node_list(nodelist, first):
    assert rdist.first_host(nodelist) == first


def test_process_group_is_destroyed_before_interpreter_finalisation():
    """refexp's exit teardown destroys the group while exit handlers still run (gloo aborts if left to finalisation).

    atexit runs handlers last-in first-out: one registered before ``init_distributed`` runs after refexp's.
    """
    code = ("import atexit, torch, torch.distributed as dist; from refexp.runtime import distributed as d; "
            "atexit.register(lambda: print('initialized at exit:', dist.is_initialized())); "
            "d.init_distributed(torch.device('cpu')); print('initialized:', dist.is_initialized())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "WORLD_SIZE", "RANK")})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == ["initialized: True", "initialized at exit: False"]


@slow
def test_two_srun_tasks_form_a_process_group_and_exit_cleanly():
    """Two processes with only SLURM's variables (as srun starts them) meet, all-reduce and both exit 0.

    The script does not destroy the group itself: refexp's exit teardown must. Without it about one pair
    in six ended with a rank aborted by gloo during interpreter finalisation (exit 134), so several pairs run.
    """
    code = ("import torch; from refexp.runtime import distributed as d; i = d.init_distributed(torch.device('cpu')); "
            "t = torch.tensor([i.rank + 1.0]); torch.distributed.all_reduce(t); "
            "print(i.rank, i.world_size, i.local_rank, t.item())")
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                              "MASTER_PORT")}
    for attempt in range(12):
        job = free_slurm_job_id()
        procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=dict(base, SLURM_PROCID=str(r), SLURM_NTASKS="2", SLURM_LOCALID=str(r),
                                                      SLURM_JOB_ID=job, SLURM_JOB_NODELIST="localhost",
                                                      OMP_NUM_THREADS="1"))
                 for r in (0, 1)]
        outs = [p.communicate(timeout=60) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], (attempt, [o[1][-2000:] for o in outs])
        assert [o[0].split() for o in outs] == [["0", "2", "0", "3.0"], ["1", "2", "1", "3.0"]]


# ---------------------------------------------------------------- degrees vs world size and model
@pytest.mark.parametrize("overrides,message", [
    (["parallelism=fsdp_tp", "parallelism.nproc_per_node=3"], "must divide the world size 3"),
    (["parallelism=hsdp", "parallelism.data_parallel_shard_degree=3"], "expected the world size 4"),
    (["parallelism=tp", "parallelism.tensor_parallel_degree=4", "parallelism.nproc_per_node=4"],
     "must divide model.n_heads=2"),
    (["parallelism=fsdp", "parallelism.spmd_backend=spmd_types"], "spmd_backend='spmd_types' is invalid"),
])
def test_parallelism_is_checked_before_anything_is_built(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(compose_small_run(tmp_path, *SMALL_GRPO_OVERRIDES, *overrides))
