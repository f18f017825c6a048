"""No temporary folder of the SFT stage outlives it: a failed stage removes its own, and a killed one's
(which runs no cleanup) is removed by the next job that takes the stage's lock (refexp/algos/sft.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import refexp.algos.sft as sft_mod
import refexp.record.atomic
from refexp.run import run
from tests.helpers.configs import compose_tiny_run

# a stage of its own (not the session's cached 30-step model), short
STAGE = ["algo=sft", "sft.steps=3", "sft.eval_every=3", "sft.seed=11"]


def _temporaries() -> list[Path]:
    return sorted((Path(os.environ["REFEXP_CACHE"]) / "sft").glob(".tmp-*"))


def _fail_at_step_2(monkeypatch):
    real = sft_mod.clip_and_step

    def step(*a, step, **k):
        if step == 2:
            raise RuntimeError("injected failure in the SFT stage")
        return real(*a, step=step, **k)

    monkeypatch.setattr(sft_mod, "clip_and_step", step)


def test_a_failed_stage_leaves_no_temporary(tmp_path, monkeypatch):
    _fail_at_step_2(monkeypatch)
    with pytest.raises(RuntimeError, match="injected failure"):
        run(compose_tiny_run(tmp_path, *STAGE))
    assert _temporaries() == []


def test_a_killed_stages_temporary_is_removed_by_the_next_start(tmp_path, monkeypatch):
    with pytest.MonkeyPatch.context() as mp:
        _fail_at_step_2(mp)
        mp.setattr(refexp.record.atomic.shutil, "rmtree", lambda *a, **k: None)  # a SIGKILL runs no cleanup
        with pytest.raises(RuntimeError, match="injected failure"):
            run(compose_tiny_run(tmp_path / "killed", *STAGE, "sft.seed=12"))
    left = _temporaries()
    assert len(left) == 1 and left[0].is_dir()
    final = run(compose_tiny_run(tmp_path / "next", *STAGE, "sft.seed=12"))
    assert _temporaries() == [] and Path(final["sft/dir"]).is_dir()
