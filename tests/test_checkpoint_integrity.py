"""Checkpoints are verified before they are trusted (refexp/record/checkpoints.py, refexp/components/checkpoint.py).

A corrupted newest checkpoint (a truncated data file or ``.metadata``, bytes overwritten in place) is
skipped with a warning naming it, and the run resumes from the one before with the numbers of an
uninterrupted run; no checkpoint that verifies is an error naming the run dir, as is a bad
``checkpoint.load_step``; a save that fails (a full disk, faked) leaves no ``step-N`` behind and
raises its own error; the non-finite guard names the newest *verified* checkpoint.
"""

from __future__ import annotations

import errno
import json
import warnings
from pathlib import Path

import pytest

from refexp.config import ConfigError
from refexp.record.checkpoints import MANIFEST
from refexp.record.metrics import read_metrics
from refexp.run import run
from tests.helpers.configs import TINY_GRPO_OVERRIDES, compose_tiny_run
from tests.helpers.runs import assert_same_row

pytestmark = pytest.mark.slow

K, N = 3, 4
CKPT = [*TINY_GRPO_OVERRIDES, "checkpoint.interval=1", "checkpoint.keep_latest_k=2"]
TOL = 1e-6


@pytest.fixture
def uninterrupted(tmp_path_factory, dense_reward):
    """An N-step run's metrics (a few seconds: per test rather than a module fixture, which could not use
    conftest's ``dense_reward``)."""
    out = tmp_path_factory.mktemp("uninterrupted")
    run(compose_tiny_run(out, *CKPT, f"training.steps={N}"))
    return _metrics(out)


def _metrics(run_dir: Path) -> dict[int, dict]:
    rows = read_metrics(run_dir)
    return {r["step"]: {k: v for k, v in r.items() if not k.startswith(("perf/", "mem/")) and not k.endswith("_s")}
            for r in rows}


def _assert_equal_to(run_dir: Path, want: dict[int, dict]) -> None:
    got = _metrics(run_dir)
    assert sorted(got) == list(range(N + 1))
    for step in range(N + 1):
        assert_same_row(got[step], want[step], other_order=False, tol=TOL, where=f"step {step}")


def _data_file(step_dir: Path) -> Path:
    return next(p for p in sorted(step_dir.iterdir()) if p.suffix == ".distcp")


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _overwrite_in_place(path: Path) -> None:
    """Same size, other bytes: flips the byte in the middle of the file."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _rerun_with_warnings(run_dir: Path, *overrides: str) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(compose_tiny_run(run_dir, *CKPT, *overrides))
    return [str(w.message) for w in caught]


def test_a_save_writes_a_manifest_of_every_file(tmp_path, dense_reward):
    run(compose_tiny_run(tmp_path, *CKPT, "training.steps=2"))
    step_dir = tmp_path / "checkpoint" / "step-2"
    files = json.loads((step_dir / MANIFEST).read_text())["files"]
    on_disk = {p.relative_to(step_dir).as_posix() for p in step_dir.rglob("*") if p.is_file()} - {MANIFEST}
    assert set(files) == on_disk and ".metadata" in files
    assert all(len(e["sha256"]) == 64 and e["size"] == (step_dir / f).stat().st_size for f, e in files.items())


@pytest.mark.parametrize("damage", ["truncated data file", "truncated .metadata", "overwritten in place"])
def test_a_corrupt_newest_checkpoint_is_skipped(tmp_path, dense_reward, uninterrupted, damage):
    run(compose_tiny_run(tmp_path, *CKPT, f"training.steps={K}"))
    newest = tmp_path / "checkpoint" / f"step-{K}"
    bad = newest / ".metadata" if "metadata" in damage else _data_file(newest)
    (_overwrite_in_place if "overwritten" in damage else _truncate)(bad)

    messages = _rerun_with_warnings(tmp_path, f"training.steps={N}")
    skipped = [m for m in messages if "skipping checkpoint" in m]
    assert len(skipped) == 1 and str(newest) in skipped[0] and bad.name in skipped[0], messages
    _assert_equal_to(tmp_path, uninterrupted)  # resumed from step-(K-1): steps K.. are run again


def test_size_only_verification_misses_an_overwrite_but_not_a_truncation(tmp_path, dense_reward):
    run(compose_tiny_run(tmp_path, *CKPT, "training.steps=2", "checkpoint.verify=size"))
    step_dir = tmp_path / "checkpoint" / "step-2"
    assert all("sha256" not in e for e in json.loads((step_dir / MANIFEST).read_text())["files"].values())
    _truncate(_data_file(step_dir))
    messages = _rerun_with_warnings(tmp_path, "training.steps=3", "checkpoint.verify=size")
    assert any("skipping checkpoint" in m and "step-2" in m for m in messages), messages


def test_no_checkpoint_that_verifies_is_an_error_naming_the_run_dir(tmp_path, dense_reward):
    run(compose_tiny_run(tmp_path, *CKPT, f"training.steps={K}"))
    for step in (K - 1, K):
        _overwrite_in_place(_data_file(tmp_path / "checkpoint" / f"step-{step}"))
    before = (tmp_path / "metrics.jsonl").read_bytes()
    with pytest.raises(ConfigError, match=rf"no checkpoint of run_dir='{tmp_path}' verifies "
                                          rf"\(step-{K}: .*step-{K - 1}"):
        _rerun_with_warnings(tmp_path, f"training.steps={N}")
    assert (tmp_path / "metrics.jsonl").read_bytes() == before  # the record is not started over


def test_a_bad_load_step_is_an_error_naming_it(tmp_path, dense_reward):
    run(compose_tiny_run(tmp_path, *CKPT, f"training.steps={K}"))
    _truncate(_data_file(tmp_path / "checkpoint" / f"step-{K - 1}"))
    with pytest.raises(ConfigError, match=rf"checkpoint.load_step={K - 1} is invalid: .*step-{K - 1}.*distcp has"):
        _rerun_with_warnings(tmp_path, f"training.steps={N}", f"checkpoint.load_step={K - 1}")
    with pytest.raises(ConfigError, match=r"checkpoint.load_step=7 is invalid: .*no complete step-7"):
        _rerun_with_warnings(tmp_path, f"training.steps={N}", "checkpoint.load_step=7")


def test_checkpoints_from_before_manifests_load_with_a_warning(tmp_path, dense_reward, uninterrupted):
    """No manifest anywhere (an older refexp wrote them): the newest whose files are complete loads,
    said to be unverified; a truncated one is still caught by the sizes ``.metadata`` records."""
    run(compose_tiny_run(tmp_path, *CKPT, f"training.steps={K}"))
    for manifest in (tmp_path / "checkpoint").glob(f"step-*/{MANIFEST}"):
        manifest.unlink()
    _truncate(_data_file(tmp_path / "checkpoint" / f"step-{K}"))
    messages = _rerun_with_warnings(tmp_path, f"training.steps={N}")
    assert any("skipping checkpoint" in m and f"step-{K}" in m for m in messages), messages
    assert any("unverified (no manifest" in m and f"step-{K - 1}" in m for m in messages), messages
    _assert_equal_to(tmp_path, uninterrupted)


def test_a_damaged_checkpoint_from_before_manifests_is_refused_naming_it(tmp_path, dense_reward, monkeypatch):
    """No manifest anywhere and the newest checkpoint's bytes damaged in place (its sizes intact): the weights it
    loads are not finite, and the resume says which checkpoint, not a NonFiniteError at the first update."""
    import torch

    from refexp.titan.optim_checkpoint import CheckpointManager

    run(compose_tiny_run(tmp_path, *CKPT, f"training.steps={K}"))
    for manifest in (tmp_path / "checkpoint").glob(f"step-*/{MANIFEST}"):
        manifest.unlink()
    load = CheckpointManager.load

    def damaged(self, step=-1):  # what a bit flip in an exponent loads as
        loaded = load(self, step=step)
        with torch.no_grad():
            next(iter(self.states["model"].model[0].parameters())).view(-1)[0] = float("nan")
        return loaded

    monkeypatch.setattr(CheckpointManager, "load", damaged)
    with pytest.raises(ConfigError, match=rf"checkpoint {tmp_path / 'checkpoint' / f'step-{K}'} \(no {MANIFEST}: "
                                          rf"written before manifests, unverified\) loaded non-finite weights"):
        _rerun_with_warnings(tmp_path, f"training.steps={N}")


def test_a_checkpoint_newer_than_a_manifested_one_without_its_manifest_is_skipped(tmp_path, dense_reward):
    """What a kill between DCP's ``.metadata`` and the manifest leaves."""
    run(compose_tiny_run(tmp_path, *CKPT, f"training.steps={K}"))
    (tmp_path / "checkpoint" / f"step-{K}" / MANIFEST).unlink()
    messages = _rerun_with_warnings(tmp_path, f"training.steps={N}")
    assert any(f"step-{K}: no {MANIFEST}" in m for m in messages), messages
    assert read_metrics(tmp_path)[-1]["step"] == N


def test_a_failed_save_leaves_no_step_dir_and_raises_its_error(tmp_path, dense_reward, monkeypatch):
    import torch.distributed.checkpoint.filesystem as dcp_fs

    run(compose_tiny_run(tmp_path, *CKPT, "training.steps=2"))
    ck = tmp_path / "checkpoint"
    kept = {p.name: (p / MANIFEST).read_bytes() for p in ck.glob("step-*")}

    def disk_full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as mp:
        mp.setattr(dcp_fs, "_write_item", disk_full)
        with pytest.raises(OSError, match="No space left on device") as raised:
            run(compose_tiny_run(tmp_path, *CKPT, "training.steps=3"))
    assert raised.value.errno == errno.ENOSPC
    assert sorted(p.name for p in ck.iterdir()) == sorted(kept) == ["step-1", "step-2"]
    assert {p.name: (p / MANIFEST).read_bytes() for p in ck.glob("step-*")} == kept
    assert run(compose_tiny_run(tmp_path, *CKPT, "training.steps=3"))["step"] == 3  # resumes from step-2


def test_the_non_finite_guard_names_the_newest_verified_checkpoint(tmp_path, dense_reward, monkeypatch):
    import refexp.algos.grpo as grpo_mod
    from refexp.algos.loop import NonFiniteError

    run(compose_tiny_run(tmp_path, *CKPT, f"training.steps={K}"))
    _overwrite_in_place(_data_file(tmp_path / "checkpoint" / f"step-{K}"))
    real = grpo_mod.grpo_loss

    def poisoned(*a, **k):
        loss, m = real(*a, **k)
        return loss * float("nan"), m

    monkeypatch.setattr(grpo_mod, "grpo_loss", poisoned)
    with pytest.raises(NonFiniteError, match=rf"non-finite loss at step {K}.*newest verified checkpoint is "
                                             rf"step-{K - 1}"):
        _rerun_with_warnings(tmp_path, f"training.steps={N}")
