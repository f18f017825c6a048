"""``RerunRecord``'s promotion, stopped at each of its writes: the run dir is either the completed run's record as it
was, or a ``running`` run (resumable from its newest checkpoint); never ``completed`` over another run's rows
(refexp/record/rerun.py)."""

from __future__ import annotations

import json

import pytest

import refexp.record.rerun as rerun_mod
from refexp.record import layout
from refexp.record.rerun import RECORD_FILES, RerunRecord, completed_end, pending_hydra_dir
from refexp.record.status import RunStatus, open_status, read_status, write_status


class Killed(Exception):
    pass


def _completed_run(run_dir) -> dict[str, bytes]:
    run_dir.mkdir()
    rows = "".join(json.dumps({"step": s, "x": s}) + "\n" for s in range(5))
    for name in RECORD_FILES:
        (run_dir / name).write_text(rows if name.endswith(".jsonl") else "training:\n  steps: 4\n")
    write_status(run_dir, {"status": "completed", "last_step": 4, "final": {}})
    return {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}


@pytest.mark.parametrize("stop_at", range(len(RECORD_FILES) + 1))
def test_a_promotion_stopped_part_way_leaves_the_record_or_a_running_run(tmp_path, monkeypatch, stop_at):
    run_dir = tmp_path / "run"
    before = _completed_run(run_dir)
    record = RerunRecord(run_dir, completed_end(read_status(run_dir)),
                         on_promote=lambda: open_status(run_dir, RunStatus(steps=6)))
    assert record.protected and record.dir == run_dir / layout.RERUN_DIR
    with open(record.dir / layout.METRICS, "a") as f:  # the rerun's step past the end, in the copy
        f.write(json.dumps({"step": 5, "x": 5}) + "\n")
    real, calls = rerun_mod.os.replace, []

    def replace(src, dst):
        if len(calls) == stop_at:
            raise Killed
        calls.append(dst)
        real(src, dst)

    monkeypatch.setattr(rerun_mod.os, "replace", replace)  # os's own: the status's atomic write is the first call
    with pytest.raises(Killed):
        record.promote()
    changed = [p.name for p in run_dir.iterdir() if p.is_file() and p.read_bytes() != before.get(p.name)]
    if stop_at == 0:
        assert changed == []
    else:  # the status went first
        assert read_status(run_dir)["status"] == "running" and layout.STATUS in changed, changed


def test_a_rerun_that_never_passes_the_end_changes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    before = _completed_run(run_dir)
    record = RerunRecord(run_dir, 4)
    (record.dir / layout.METRICS).write_text("")  # truncated, to be logged again
    record.discard()
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before
    assert not (run_dir / layout.RERUN_DIR).exists()
    assert completed_end({"status": "failed", "last_step": 3}) is None


def test_the_copy_is_promoted_past_the_completed_end_not_at_it(tmp_path):
    """A rerun logs the completed run's last step (4) again before it reaches step 5: that row is still the
    completed run's, so the copy stays the record's until step 5 (an off-by-one here writes the completed run's
    record over with a rerun that may yet stop short of it)."""
    run_dir = tmp_path / "run"
    before = _completed_run(run_dir)
    promoted = []
    record = RerunRecord(run_dir, 4, on_promote=lambda: promoted.append(True))
    for step in range(5):
        assert record.before_log(step) is False, step
    assert record.protected and not promoted and record.dir == run_dir / layout.RERUN_DIR
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before
    assert record.before_log(5) is True
    assert promoted == [True] and not record.protected and record.dir == run_dir
    assert record.before_log(6) is False  # promoted once


def _hydra_files(where) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in where.iterdir()}


def _write_hydra(run_dir) -> dict[str, bytes]:
    """The run's ``.hydra/`` as its sweep job wrote it; returns its files."""
    hydra = run_dir / layout.HYDRA_DIR
    hydra.mkdir()
    (hydra / "overrides.yaml").write_text("- training.lr=0.001\n- training.seed=0\n")
    (hydra / "config.yaml").write_text("training:\n  lr: 0.001\n")
    return _hydra_files(hydra)


def _write_pending_hydra(run_dir) -> dict[str, bytes]:
    """A rerun's ``.hydra/`` where ``refexp/record/hydra_record.py`` writes it (the learning rate spelled another
    way, more steps); returns its files."""
    pending = pending_hydra_dir(run_dir)
    pending.mkdir(parents=True)
    (pending / "overrides.yaml").write_text("- training.lr=1e-3\n- training.seed=0\n- training.steps=6\n")
    (pending / "config.yaml").write_text("training:\n  lr: 0.001\n  steps: 6\n")
    return _hydra_files(pending)


def test_a_reruns_hydra_record_waits_beside_the_copy_and_goes_with_it(tmp_path):
    """A rerun's pending ``.hydra/`` survives the copy being made; a rerun that never passes the end removes it with
    the copy, leaving the run's; the promotion makes it the run's."""
    run_dir = tmp_path / "run"
    _completed_run(run_dir)
    sweep_jobs = _write_hydra(run_dir)
    _write_pending_hydra(run_dir)
    RerunRecord(run_dir, 4).discard()
    assert _hydra_files(run_dir / layout.HYDRA_DIR) == sweep_jobs
    assert not (run_dir / layout.RERUN_DIR).exists()

    reruns = _write_pending_hydra(run_dir)
    record = RerunRecord(run_dir, 4, on_promote=lambda: open_status(run_dir, RunStatus(steps=6)))
    assert _hydra_files(pending_hydra_dir(run_dir)) == reruns  # the copy was made beside it
    assert record.before_log(5)
    assert _hydra_files(run_dir / layout.HYDRA_DIR) == reruns
    assert not (run_dir / layout.RERUN_DIR).exists()


def test_a_killed_reruns_pending_hydra_is_dropped_where_no_completed_run_is_protected(tmp_path):
    """A promotion killed after the status write leaves a ``running`` run and the copy: the next invocation is no
    rerun of a completed run, writes ``.hydra/`` itself and drops the killed one's pending files."""
    run_dir = tmp_path / "run"
    _completed_run(run_dir)
    write_status(run_dir, {"status": "running", "last_step": 5})
    _write_pending_hydra(run_dir)
    RerunRecord(run_dir, completed_end(read_status(run_dir)))
    assert not (run_dir / layout.RERUN_DIR).exists()
