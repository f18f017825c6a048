"""Resume equals uninterrupted; kills during a save fall back to the last good checkpoint; SIGTERM saves.

A run stopped after step K (``training.steps=K``) and rerun in the same run dir with
``training.steps=N`` must log, for steps K+1..N, the metrics of an uninterrupted N-step run (within
TOL), and ``metrics.jsonl`` must hold every step once. The runs cross a periodic reset (every 2
steps) or EMA updates (every step), with the adaptive KL controller on (``algo.kl_target``, a short
horizon so beta moves), and a DPO run with an EMA reference.

Killing: a ``step-N`` folder without DCP's ``.metadata`` (what a SIGKILL during a save leaves) is
simulated exactly, and a real subprocess is SIGKILLed as soon as a ``step-N`` folder appears
without ``.metadata`` (or, if the save is too quick to catch, wherever it is). A SIGTERM'd
subprocess saves the step it was on and exits with status ``preempted``. ``keep_latest_k`` prunes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from refexp.config import register_configs
from refexp.record.metrics import read_metrics
from refexp.record.status import read_status
from refexp.run import run

pytestmark = pytest.mark.slow

CONF = Path(__file__).resolve().parents[1] / "conf"
TOL = 1e-6
K, N = 3, 6

SMALL = [
    "model=tiny", "model.dim=32", "model.ffn_hidden_dim=64", "model.n_heads=2", "model.n_kv_heads=2",
    "task.digits=1", "task.num_train=80", "task.num_eval=16",
    "sft.steps=120", "sft.target_accuracy=1.0", "sft.eval_every=40", "sft.batch_size=32",
    "eval.num_prompts=16", "eval.kl_prompts=8", "eval.every=2",
    "logger=none", "logger.progress=false", "training.num_threads=1", "training.lr=1e-3",
    "checkpoint.interval=1", "checkpoint.keep_latest_k=2",
]
GRPO = ["algo=grpo", "algo.prompts_per_step=4", "algo.group_size=4", "algo.kl_target=0.01", "algo.kl_horizon=10"]
RUNS = {
    "grpo-periodic_reset": [*GRPO, "reference=periodic_reset", "reference.reset_every=2"],
    "grpo-ema": [*GRPO, "reference=ema", "reference.alpha=0.5"],
    "dpo-ema": ["algo=dpo", "algo.num_pairs=32", "algo.pairs_per_step=8", "reference=ema", "reference.alpha=0.5"],
}
register_configs()


def compose_small(run_dir: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=[*SMALL, f"run_dir={run_dir}", *overrides])


def metrics(run_dir: Path) -> dict[int, dict]:
    rows = read_metrics(Path(run_dir))
    steps = [r["step"] for r in rows]
    assert steps == sorted(set(steps)), f"{run_dir}: steps not logged exactly once, in order: {steps}"
    return {r["step"]: r for r in rows}


def assert_resumed_equal(run_dir: Path, want_dir: Path, first: int) -> None:
    """Steps first..N of run_dir equal the uninterrupted run's; every step 0..N is there once."""
    got, want = metrics(run_dir), metrics(want_dir)
    assert sorted(got) == list(range(N + 1))
    for step in range(first, N + 1):
        g = {k: v for k, v in got[step].items() if not k.startswith(("perf/", "mem/"))}
        w = {k: v for k, v in want[step].items() if not k.startswith(("perf/", "mem/"))}
        assert g.keys() == w.keys(), f"step {step}: {sorted(g.keys() ^ w.keys())}"
        bad = {k: (g[k], w[k]) for k in w if abs(g[k] - w[k]) > TOL * max(1.0, abs(w[k]))}
        assert not bad, f"step {step}: {bad}"


def ckpt_steps(run_dir: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in (run_dir / "checkpoint").glob("step-*"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "refexp-cache"  # conftest's session cache
    out = tmp_path_factory.mktemp("uninterrupted")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REFEXP_CACHE", str(cache))
        for name, overrides in RUNS.items():
            run(compose_small(out / name, *overrides, f"training.steps={N}"))
    return out


def test_uninterrupted_runs_move(uninterrupted):
    """The runs cross what a resume must carry: reference updates, beta, optimizer moments."""
    pr, ema = metrics(uninterrupted / "grpo-periodic_reset"), metrics(uninterrupted / "grpo-ema")
    assert [pr[s]["ref/version"] for s in range(1, N + 1)] == [0, 1, 1, 2, 2, 3]
    assert [ema[s]["ref/version"] for s in range(1, N + 1)] == [1, 2, 3, 4, 5, 6]
    assert pr[N]["kl/beta"] != pr[1]["kl/beta"] and ema[N]["kl/beta"] != ema[1]["kl/beta"]
    assert ckpt_steps(uninterrupted / "grpo-ema") == [N - 1, N]  # keep_latest_k=2, the final save too


@pytest.mark.parametrize("name", list(RUNS))
def test_resume_equals_uninterrupted(tmp_path, uninterrupted, name):
    run(compose_small(tmp_path, *RUNS[name], f"training.steps={K}"))
    assert ckpt_steps(tmp_path) == [K - 1, K]
    run(compose_small(tmp_path, *RUNS[name], f"training.steps={N}"))
    assert_resumed_equal(tmp_path, uninterrupted / name, K + 1)
    assert ckpt_steps(tmp_path) == [N - 1, N]


def test_half_written_checkpoint_is_skipped(tmp_path, uninterrupted):
    """What a SIGKILL in the middle of saving step 5 leaves: ``step-5`` without ``.metadata`` (the
    data files of a real save are there), metrics logged for steps 4-5 and a torn last line."""
    name = "grpo-periodic_reset"
    run(compose_small(tmp_path, *RUNS[name], f"training.steps={K}"))
    ck = tmp_path / "checkpoint"
    shutil.copytree(ck / f"step-{K}", ck / "step-5")
    (ck / "step-5" / ".metadata").unlink()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 4, "loss/total": 123.0}) + "\n" + json.dumps({"step": 5, "loss/total": 1.0}) + "\n")
        f.write('{"step": 6, "loss/to')
    run(compose_small(tmp_path, *RUNS[name], f"training.steps={N}"))
    assert_resumed_equal(tmp_path, uninterrupted / name, K + 1)
    assert ckpt_steps(tmp_path) == [N - 1, N] and (ck / "step-5" / ".metadata").is_file()


# ---------------------------------------------------------------- real signals, real processes
def _start(run_dir: Path, steps: int) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="1")
    args = [sys.executable, "-m", "refexp", *SMALL, *RUNS["grpo-ema"], f"training.steps={steps}", f"run_dir={run_dir}"]
    run_dir.mkdir(parents=True)
    with open(run_dir.with_suffix(".log"), "w") as log:
        return subprocess.Popen(args, env=env, cwd=CONF.parent, stdout=log, stderr=subprocess.STDOUT)


def _log_tail(run_dir: Path) -> str:
    return run_dir.with_suffix(".log").read_text()[-3000:]


def _wait_for(pred, proc: subprocess.Popen, timeout: float, poll: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(poll)
    return False


def _logged_steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_metrics(run_dir)]


def _saving(run_dir: Path) -> bool:
    ck = run_dir / "checkpoint"
    return ck.is_dir() and any(not (p / ".metadata").exists() for p in ck.glob("step-*"))


def test_sigterm_saves_and_sigkill_resumes(tmp_path, uninterrupted):
    """Two subprocesses at once (start-up dominates): one gets SIGTERM after its first step, the other
    SIGKILL while a checkpoint is being written. Both then resume here to the uninterrupted numbers."""
    term_dir, kill_dir = tmp_path / "term", tmp_path / "kill"
    term = _start(term_dir, steps=100)
    kill = _start(kill_dir, steps=N)
    try:
        assert _wait_for(lambda: 1 in _logged_steps(term_dir), term, 90, 0.01), _log_tail(term_dir)
        term.send_signal(signal.SIGTERM)
        # the second process: catch a save in flight (checkpoint.interval=1: one per step; a save's
        # files take ~10-50 ms to write on this machine), at the latest once step 3 is logged
        caught = {"saving": False, "polls": 0}

        def ready() -> bool:
            caught["saving"] = _saving(kill_dir)
            caught["polls"] += 1
            return caught["saving"] or (caught["polls"] % 20 == 0 and 3 in _logged_steps(kill_dir))

        assert _wait_for(ready, kill, 90, 0.001), _log_tail(kill_dir)
        kill.send_signal(signal.SIGKILL)
        term_rc, kill_rc = term.wait(60), kill.wait(60)
    finally:
        for p in (term, kill):
            if p.poll() is None:
                p.kill()

    # SIGTERM: the step in progress finished, was saved, and the run said so
    assert term_rc != 0, "a preempted run must not look completed"
    status = read_status(term_dir)
    stopped = max(_logged_steps(term_dir))
    assert status["status"] == "preempted" and status["last_step"] == stopped, status
    assert stopped < N and (term_dir / "checkpoint" / f"step-{stopped}" / ".metadata").is_file()
    assert max(_logged_steps(term_dir)) == stopped

    # SIGKILL: whatever it left (a half-written step folder if `caught`), the rerun resumes from the last good one
    assert kill_rc == -signal.SIGKILL
    for run_dir in (term_dir, kill_dir):  # the steps before the stop had the same config: compare all
        run(compose_small(run_dir, *RUNS["grpo-ema"], f"training.steps={N}"))
        assert_resumed_equal(run_dir, uninterrupted / "grpo-ema", 1)
    print(f"SIGTERM after step {stopped}; SIGKILL {'during a save' if caught['saving'] else 'between saves'}")
