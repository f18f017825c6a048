"""Running refexp as tests do (a command line in a subprocess, or torchrun) and reading what a run wrote:
its metrics by step, its status, and two runs' metrics compared."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from refexp.record.metric_names import thresholded
from refexp.record.metrics import read_metrics
from refexp.record.status import read_status
from tests.helpers.configs import CONF_DIR

LAUNCH_TIMEOUT_S = 120  # per launch of a few 2-process jobs; start-up (imports) takes most of it
SAME_METRICS_TOL = 128 * torch.finfo(torch.float32).eps
"""Two float32 runs of the same arithmetic summed in another order (other ranks, micro-batches, kernels): values
agree within this, relative to max(1, |value|): 128 units in the last place at 1.0 (1.5e-5), room for the
rounding a few steps accumulate."""


def metrics_by_step(run_dir: Path, *, in_order: bool = False) -> dict[int, dict]:
    """step -> the row ``metrics.jsonl`` logged for it; fails when a step was logged twice (or, with
    ``in_order``, when the steps are not logged in increasing order)."""
    rows = read_metrics(Path(run_dir))
    steps = [r["step"] for r in rows]
    if in_order:
        assert steps == sorted(set(steps)), f"{run_dir}: steps not logged exactly once, in order: {steps}"
    else:
        assert len(steps) == len(set(steps)), f"{run_dir}: steps logged twice: {steps}"
    return {r["step"]: r for r in rows}


def run_status(run_dir: Path) -> dict:
    """The run's ``status.json``."""
    return read_status(Path(run_dir))


def compared_values(row: dict) -> dict:
    """A metrics row without what depends on the machine (``perf/*``, ``mem/*``) and without non-numbers."""
    return {k: v for k, v in row.items() if not k.startswith(("perf/", "mem/")) and isinstance(v, (int, float))}


def assert_same_row(got: dict, want: dict, *, other_order: bool, tol: float = SAME_METRICS_TOL, where="") -> None:
    """Two metrics rows log the same metrics with values within ``tol`` relative to max(1, |want|). With
    ``other_order`` (runs summing in another order) the thresholded metrics (the registry's ``thresholded``:
    counts that a tie flips by one unit) are left out of the values compared; the continuous ones they
    threshold are compared."""
    g, w = compared_values(got), compared_values(want)
    assert g.keys() == w.keys(), f"{where}: keys differ: {sorted(g.keys() ^ w.keys())}"
    skip = thresholded() if other_order else frozenset()
    bad = {k: (g[k], w[k]) for k in w if k not in skip and abs(g[k] - w[k]) > tol * max(1.0, abs(w[k]))}
    assert not bad, f"{where}: {bad}"


def assert_same_metrics(got_dir: Path, want_dir: Path, *, other_order: bool, tol: float = SAME_METRICS_TOL) -> None:
    """Both runs logged the same steps, the same metrics and the same values (``assert_same_row``).
    ``other_order``: the runs sum in another order (ranks, micro-batches), so thresholded counts may differ."""
    got, want = metrics_by_step(got_dir), metrics_by_step(want_dir)
    assert sorted(got) == sorted(want), f"steps {sorted(got)} vs {sorted(want)}"
    for step in want:
        assert_same_row(got[step], want[step], other_order=other_order, tol=tol,
                        where=f"{got_dir} vs {want_dir}, step {step}")


def launch(args: list[str], cache: Path, *, timeout: int = LAUNCH_TIMEOUT_S) -> subprocess.CompletedProcess:
    """``args`` run from the repository root with one intra-op thread, ``cache`` as the refexp cache and W&B
    offline; fails with the end of stderr unless it exits 0."""
    env = dict(os.environ, OMP_NUM_THREADS="1", REFEXP_CACHE=str(cache), WANDB_MODE="offline", HYDRA_FULL_ERROR="1")
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, cwd=CONF_DIR.parent)
    assert proc.returncode == 0, f"{' '.join(args[:6])} ... failed ({proc.returncode}):\n{proc.stderr[-5000:]}"
    return proc


def torchrun(*overrides: str, cache: Path, nproc: int = 2) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc_per_node=nproc -m refexp overrides...``."""
    return launch([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                   "-m", "refexp", *overrides], cache)
