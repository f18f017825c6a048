"""Loading a checkpoint does not run code: DCP's ``.metadata`` (a pickle) is read by the restricted unpickler
(refexp/record/safe_pickle.py, refexp/titan/dcp_reader.py) on every path refexp loads DCP from, and a
crafted one is refused in one line naming the file, its payload never run."""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader

from refexp import titan
from refexp.config import ConfigError, ModelConfig
from refexp.record.checkpoints import dcp_structure_mismatch, write_manifest
from refexp.record.safe_pickle import UnsafePickle, read_dcp_metadata
from refexp.titan.dcp_reader import SafeFileSystemReader

TINY = ModelConfig(dim=32, n_layers=1, n_heads=2, n_kv_heads=2, ffn_hidden_dim=64, max_seq_len=32)


class _Payload:
    """A pickle that runs ``touch marker`` when plain ``pickle.load`` reads it (as a crafted file would)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def plant_metadata(dcp_dir: Path, marker: Path) -> Path:
    """``dcp_dir/.metadata`` replaced by the payload; returns the file."""
    dcp_dir.mkdir(parents=True, exist_ok=True)
    f = dcp_dir / ".metadata"
    f.write_bytes(pickle.dumps(_Payload(marker)))
    return f


def test_the_payload_runs_under_plain_pickle(tmp_path):
    """The control: the planted file is a real attack (torch's own reader runs it)."""
    plant_metadata(tmp_path / "ck", tmp_path / "ran")
    try:
        FileSystemReader(str(tmp_path / "ck")).read_metadata()
    except Exception:
        pass  # os.system returns an int, not a Metadata: torch fails after the payload ran
    assert (tmp_path / "ran").exists()


def test_a_full_checkpoints_metadata_reads_as_torch_reads_it(tmp_path):
    """Model, optimizer and refexp's train_state (with plain extras) admit every global they need."""
    titan.prepare_torchtitan("cpu")
    model = titan.build_model(TINY, vocab_size=17, device="cpu", seed=1)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randint(0, 17, (2, 5))).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optim": opt.state_dict(),
             "train_state": {"step": torch.tensor(3), "extra": {"kl": 0.5, "names": ["a"], "none": None}},
             "bf16": torch.zeros(3, dtype=torch.bfloat16)}
    dcp.save(state, checkpoint_id=str(tmp_path / "ck"), no_dist=True)
    ours = read_dcp_metadata(tmp_path / "ck")
    torchs = FileSystemReader(str(tmp_path / "ck")).read_metadata()
    assert ours.state_dict_metadata == torchs.state_dict_metadata
    assert ours.storage_data == torchs.storage_data
    assert dcp_structure_mismatch(tmp_path / "ck") is None


def test_a_crafted_metadata_is_refused_by_every_reader_and_not_run(tmp_path):
    marker = tmp_path / "ran"
    f = plant_metadata(tmp_path / "ck", marker)
    with pytest.raises(UnsafePickle, match=re.escape(str(f)) + ".*posix.system"):
        read_dcp_metadata(tmp_path / "ck")
    with pytest.raises(UnsafePickle, match=re.escape(str(f))):
        SafeFileSystemReader(str(tmp_path / "ck")).read_metadata()
    assert "refused to load" in dcp_structure_mismatch(tmp_path / "ck")  # a legacy checkpoint's check
    assert not marker.exists()


@pytest.mark.parametrize("layout", ["sft_output", "step_dir", "run_dir"])
def test_load_weights_refuses_a_crafted_metadata_in_one_line(tmp_path, layout):
    """``sft.checkpoint``, ``reference.checkpoint``, ``checkpoint.initial_load_path`` and the SFT cache all load
    through ``titan.load_weights``: each kind of dir it accepts, planted, is a one-line ConfigError."""
    titan.prepare_torchtitan("cpu")
    model = titan.build_model(TINY, vocab_size=17, device="cpu", seed=1)
    marker = tmp_path / "ran"
    where = {"sft_output": tmp_path / "d" / "model", "step_dir": tmp_path / "d",
             "run_dir": tmp_path / "d" / "checkpoint" / "step-2"}[layout]
    f = plant_metadata(where, marker)
    if layout == "run_dir":  # someone who can write the file can write its manifest too
        write_manifest(where, checksums=True)
    with pytest.raises(ConfigError) as e:
        titan.load_weights(model, TINY, tmp_path / "d")
    assert str(f) in str(e.value) and "refused" in str(e.value) and "\n" not in str(e.value)
    assert not marker.exists()


def test_a_resume_refuses_a_crafted_checkpoint_with_a_manifest(tmp_path):
    """The resume's path: ``is_model_only`` reads the chosen step's ``.metadata`` and torchtitan's manager
    loads it (``CheckpointManager.dcp_load``); a verified manifest does not make it trusted."""
    from refexp.components.checkpoint import is_model_only
    from refexp.titan.optim_checkpoint import CheckpointManager

    marker = tmp_path / "ran"
    step = tmp_path / "checkpoint" / "step-2"
    f = plant_metadata(step, marker)
    write_manifest(step, checksums=True)
    with pytest.raises(ConfigError, match=re.escape(str(f))):
        is_model_only(step)
    manager = CheckpointManager.__new__(CheckpointManager)  # dcp_load reads no attribute before the check
    with pytest.raises(ConfigError, match=re.escape(str(f))):
        manager.dcp_load({}, str(step), from_hf=False, from_quantized=False)
    assert not marker.exists()


@pytest.mark.slow
def test_a_run_started_from_a_crafted_sft_checkpoint_is_refused_unrun(tmp_path):
    """``sft.checkpoint=DIR`` with a planted ``DIR/model/.metadata``: the run fails with the one line, and
    the payload never ran."""
    from refexp.run import run
    from tests.helpers.configs import TINY_GRPO_OVERRIDES, compose_tiny_run

    marker = tmp_path / "ran"
    f = plant_metadata(tmp_path / "start" / "model", marker)
    with pytest.raises(ConfigError, match=re.escape(str(f))):
        run(compose_tiny_run(tmp_path / "run", *TINY_GRPO_OVERRIDES, f"sft.checkpoint={tmp_path / 'start'}"))
    assert not marker.exists()


@pytest.mark.slow
def test_a_metadata_planted_in_a_shared_sft_cache_entry_is_refused_unrun(tmp_path, monkeypatch):
    """A ``.metadata`` planted in the SFT cache: refused by the entry's manifest (a checksum); planted with the
    manifest removed, the entry is refused for want of it (refexp/record/cache_dirs.py), unrun."""
    import refexp.algos.sft as sft_mod
    from refexp.record.cache_dirs import CorruptCacheEntry, manifest_path
    from refexp.run import run
    from tests.helpers.configs import TINY_GRPO_OVERRIDES, compose_tiny_run

    # its own stage: test_sft_temporaries trains seeds 11 and 12 in the same session cache
    sft = ("sft.steps=3", "sft.eval_every=3", "sft.seed=22")
    sft_dir = Path(run(compose_tiny_run(tmp_path / "a", "algo=sft", *sft))["sft/dir"])
    monkeypatch.setattr(sft_mod, "train_sft", lambda *a, **k: pytest.fail("the cached SFT model was rebuilt"))
    marker = tmp_path / "ran"
    plant_metadata(sft_dir / "model", marker)
    grpo = compose_tiny_run(tmp_path / "b", *TINY_GRPO_OVERRIDES, *sft)
    with pytest.raises(CorruptCacheEntry, match=re.escape(str(sft_dir)) + ".*model/.metadata"):
        run(grpo)
    manifest_path(sft_dir).unlink()
    with pytest.raises(CorruptCacheEntry, match=re.escape(str(sft_dir)) + r" is corrupt \(no refexp-manifest.json"):
        run(compose_tiny_run(tmp_path / "c", *TINY_GRPO_OVERRIDES, *sft))
    assert not marker.exists()


def test_a_truncated_shard_is_named_in_one_line_before_dcp_reads_it(tmp_path):
    """A DCP dir whose shard is shorter than its ``.metadata`` says (a truncated copy, a legacy cache entry
    without a manifest): one line naming the dir and the file, not DCP's EOFError."""
    titan.prepare_torchtitan("cpu")
    model = titan.build_model(TINY, vocab_size=17, device="cpu", seed=1)
    titan.save_model_weights(model, tmp_path / "sft" / "model")
    shard = next((tmp_path / "sft" / "model").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:1000])
    with pytest.raises(ConfigError) as e:
        titan.load_weights(model, TINY, tmp_path / "sft")
    assert str(tmp_path / "sft" / "model") in str(e.value) and shard.name in str(e.value)
    assert "\n" not in str(e.value)
