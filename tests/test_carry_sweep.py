"""scripts/carry_sweep.py: an unfinished sweep carried to the next sitting holds its completed runs (no checkpoint,
no W&B dir), every sweep's multirun.yaml and the SFT starts those runs recorded, and its check verifies each start
against the manifest it was sealed with."""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

import pytest

from refexp.record.cache_dirs import write_entry_manifest
from refexp.report.reading.archive import ARCHIVE, extracted

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import carry_sweep  # noqa: E402


def _run(run: Path, status: str, key: str) -> None:
    """A run dir as refexp leaves it: record files, a checkpoint and a W&B dir."""
    (run / "checkpoint" / "step-3").mkdir(parents=True)
    (run / "checkpoint" / "step-3" / "weights.distcp").write_bytes(b"\0" * 64)
    (run / "wandb").mkdir()
    (run / ".hydra").mkdir()
    (run / ".hydra" / "overrides.yaml").write_text("- training.seed=0\n")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 3, "kl/init": 0.1}) + "\n")
    (run / "status.json").write_text(json.dumps({"status": status, "sft_start": {"key": key}}))


@pytest.fixture
def sweep_and_cache(tmp_path):
    sweep, cache = tmp_path / "sweep", tmp_path / "cache"
    for name in ("none", "start0/fixed"):
        (sweep / name).mkdir(parents=True)
        (sweep / name / "multirun.yaml").write_text("hydra: {}\n")
    _run(sweep / "none" / "0", "completed", "aaaa000000000000")
    _run(sweep / "none" / "1", "completed", "bbbb000000000000")
    _run(sweep / "start0" / "fixed" / "0", "completed", "aaaa000000000000")
    _run(sweep / "start0" / "fixed" / "1", "running", "aaaa000000000000")
    for key in ("aaaa000000000000", "bbbb000000000000", "cccc000000000000"):
        entry = cache / "sft" / key
        (entry / "hf").mkdir(parents=True)
        (entry / "hf" / "model.safetensors").write_bytes(key.encode() * 8)
        write_entry_manifest(entry)
    return sweep, cache


def test_completed_runs_and_their_starts_are_carried_and_checked(sweep_and_cache, tmp_path):
    sweep, cache = sweep_and_cache
    out = tmp_path / "in_progress"
    n, keys = carry_sweep.carry(sweep, cache, out)
    assert (n, keys) == (3, ["aaaa000000000000", "bbbb000000000000"])
    with extracted(out / ARCHIVE) as runs:
        carried = sorted(str(p.relative_to(runs)) for p in runs.rglob("*") if p.is_file())
    assert "start0/fixed/1/status.json" not in carried  # the run still running when the sweep was stopped
    assert not [p for p in carried if "checkpoint" in p or "wandb" in p]
    assert {"none/multirun.yaml", "start0/fixed/multirun.yaml", "start0/fixed/0/metrics.jsonl"} <= set(carried)
    with tarfile.open(out / carry_sweep.STARTS) as tar:
        members = tar.getmembers()
    assert {m.name.split("/")[0] for m in members} == {"aaaa000000000000", "bbbb000000000000"}
    assert {m.mtime for m in members} == {0}
    report = carry_sweep.check(out)
    assert "2 completed runs in none" in report and "1 completed runs in start0/fixed" in report
    assert report.count("every file matches its manifest") == 2


def test_a_start_altered_after_it_was_sealed_fails_the_check(sweep_and_cache, tmp_path):
    sweep, cache = sweep_and_cache
    (cache / "sft" / "bbbb000000000000" / "hf" / "model.safetensors").write_bytes(b"other weights")
    out = tmp_path / "in_progress"
    carry_sweep.carry(sweep, cache, out)
    with pytest.raises(Exception, match="bbbb000000000000"):
        carry_sweep.check(out)


def test_a_cache_without_the_runs_starts_is_one_error_line(sweep_and_cache, tmp_path):
    sweep, _ = sweep_and_cache
    with pytest.raises(SystemExit, match=r"has no entry aaaa000000000000, bbbb000000000000: CACHE must be"):
        carry_sweep.carry(sweep, tmp_path / "elsewhere", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_starts_archive_holding_every_start_is_kept_as_it_is(sweep_and_cache, tmp_path):
    sweep, cache = sweep_and_cache
    out = tmp_path / "in_progress"
    carry_sweep.carry(sweep, cache, out)
    before = (out / carry_sweep.STARTS).read_bytes()
    (sweep / "start0" / "fixed" / "1" / "status.json").write_text(
        json.dumps({"status": "completed", "sft_start": {"key": "aaaa000000000000"}}))
    assert carry_sweep.carry(sweep, cache, out)[0] == 4
    assert (out / carry_sweep.STARTS).read_bytes() == before
