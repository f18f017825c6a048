"""A checkpoint belongs to its run: its manifest records the run (config, run dir, the weights it started from), and
a resume refuses another run's checkpoint, or one trained from other start weights, in one line naming both
(refexp/components/run_identity.py, refexp/record/pins.py); ``checkpoint.folder`` stays inside the run dir."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from refexp.components.run_identity import foreign_checkpoint, run_identity
from refexp.config import ConfigError
from refexp.record.checkpoints import MANIFEST
from refexp.record.pins import content_hash, pin, pin_mismatch
from refexp.record.status import read_status
from refexp.run import run
from tests.helpers.configs import TINY_GRPO_OVERRIDES, compose_root, compose_tiny_run

CONFIG = {"training": {"seed": 0, "steps": 4, "lr": 1e-3}, "reference": {"name": "fixed"}, "run_dir": "a"}


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_checkpoint_of_another_configuration_is_refused_naming_both_runs(tmp_path):
    theirs = run_identity(CONFIG, tmp_path / "a")
    other = {**CONFIG, "training": {**CONFIG["training"], "seed": 7}, "reference": {"name": "none"}}
    problem = foreign_checkpoint(theirs, run_identity(other, tmp_path / "b"), "ckpt/step-6")
    assert problem is not None and "\n" not in problem
    assert str(tmp_path / "a") in problem and str(tmp_path / "b") in problem
    assert "reference.name: 'fixed' -> 'none'" in problem and "training.seed: 0 -> 7" in problem
    # what a resume may change (training.steps, the run dir) is the same run; so is a checkpoint from before identities
    longer = {**CONFIG, "training": {**CONFIG["training"], "steps": 10}}
    with pytest.warns(UserWarning, match="moved or copied"):
        assert foreign_checkpoint(theirs, run_identity(longer, tmp_path / "moved"), "ckpt/step-6") is None
    assert foreign_checkpoint(None, run_identity(other, tmp_path / "b"), "ckpt/step-6") is None


def test_start_weights_are_pinned_by_content(tmp_path):
    start = tmp_path / "sft" / "model"
    start.mkdir(parents=True)
    (start / ".metadata").write_bytes(b"meta")
    (start / "__0_0.distcp").write_bytes(bytes(range(256)) * 8)
    (start.parent / "sft.json").write_text("{}")  # not a weight file: it does not count
    before = pin(start.parent)
    (start.parent / "sft.json").write_text('{"changed": 1}')
    assert content_hash(start.parent) == before["sha256"]
    _flip_a_byte(start / "__0_0.distcp")
    after = pin(start.parent)
    problem = pin_mismatch({"start model": before}, {"start model": after})
    assert problem is not None and before["sha256"][:16] in problem and after["sha256"][:16] in problem
    assert pin_mismatch({"start model": before}, {"start model": before}) is None
    assert pin_mismatch({}, {"start model": after}) is None  # recorded before pins
    assert content_hash(tmp_path / "no-such-dir") is None


def test_the_start_pin_covers_the_weights_the_loader_reads(tmp_path):
    """Another model's config.json and model.safetensors copied beside an SFT output's ``model/`` (DCP) make the
    loader read the dir as HF: the pin then covers those files, so a resume from it sees other weights."""
    import torch

    from refexp import titan
    from refexp.config import ModelConfig

    cfg = ModelConfig(dim=32, n_layers=1, n_heads=2, n_kv_heads=2, ffn_hidden_dim=64, max_seq_len=32, vocab_size=17)
    titan.prepare_torchtitan("cpu")
    start, other = (titan.build_model(cfg, vocab_size=17, device="cpu", seed=s) for s in (1, 2))
    sft = tmp_path / "sft"
    titan.save_model_weights(start, sft / "model")
    titan.export_hf(other, cfg, str(tmp_path / "other"))
    before = pin(sft)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tmp_path / "other" / name, sft / name)

    loaded = titan.build_model(cfg, vocab_size=17, device="cpu", seed=3)
    titan.load_weights(loaded, cfg, sft)  # what a run starting from the dir would load: the other model
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), other.state_dict().values()))
    problem = pin_mismatch({"start model": before}, {"start model": pin(sft)})
    assert problem is not None and "other weights" in problem


def test_the_pin_of_an_initial_load_read_as_hf_covers_what_the_hf_reader_loads(tmp_path):
    """``checkpoint.initial_load_in_hf`` reads ``initial_load_path`` as HF whatever it holds: a DCP checkpoint with
    another model's ``model.safetensors`` beside it (no config.json, so its files alone say DCP) loads that model,
    and its pin covers those files, so a resume onto other safetensors there is refused."""
    import torch

    from refexp import titan
    from refexp.components.run_identity import start_pins
    from refexp.config import ModelConfig, to_object

    cfg = ModelConfig(dim=32, n_layers=1, n_heads=2, n_kv_heads=2, ffn_hidden_dim=64, max_seq_len=32, vocab_size=17)
    titan.prepare_torchtitan("cpu")
    start, other, third = (titan.build_model(cfg, vocab_size=17, device="cpu", seed=s) for s in (1, 2, 3))
    initial = tmp_path / "initial"
    titan.save_model_weights(start, initial)
    for name, model in (("other", other), ("third", third)):
        titan.export_hf(model, cfg, str(tmp_path / name))
    shutil.copy(tmp_path / "other" / "model.safetensors", initial)

    loaded = titan.build_model(cfg, vocab_size=17, device="cpu", seed=4)
    titan.load_weights(loaded, cfg, initial, hf=True)  # what build_policy loads with initial_load_in_hf=true
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), other.state_dict().values()))
    root = to_object(compose_root(f"checkpoint.initial_load_path={initial}", "checkpoint.initial_load_in_hf=true"))
    before = start_pins(root, tmp_path / "sft")
    shutil.copy(tmp_path / "third" / "model.safetensors", initial)  # the DCP files the dir's contents name stay
    problem = pin_mismatch(before, start_pins(root, tmp_path / "sft"))
    assert problem is not None and problem.startswith("the checkpoint.initial_load_path this run began from")


def test_initial_load_in_hf_without_initial_load_path_is_refused():
    """It says how ``initial_load_path`` is read; the start the reference and the kl/init anchor read too is read as
    its files say, so forcing the HF reader on it for the policy alone is refused in one line."""
    from refexp.config import to_object

    with pytest.raises(ConfigError, match=r"^checkpoint\.initial_load_in_hf=True is invalid: expected false without "
                                          r"checkpoint\.initial_load_path"):
        to_object(compose_root("checkpoint.initial_load_in_hf=true"))


@pytest.mark.parametrize("folder", ["/tmp/shared-checkpoints", "../elsewhere", "a/../../b", "."])
def test_a_checkpoint_folder_outside_the_run_dir_is_refused(folder):
    from refexp.config import to_object

    with pytest.raises(ConfigError, match=r"checkpoint\.folder=.* is invalid: expected a relative path inside the run"):
        to_object(compose_root(f"checkpoint.folder={folder}"))


@pytest.mark.slow
def test_a_resume_refuses_another_runs_checkpoint_and_other_start_weights(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    run(compose_tiny_run(a, *TINY_GRPO_OVERRIDES, "training.steps=2"))
    manifest = json.loads((a / "checkpoint" / "step-2" / MANIFEST).read_text())
    assert manifest["run"]["run_dir"] == str(a.resolve()) and manifest["run"]["pins"]["start model"]["sha256"]
    assert read_status(a)["sft_start"]["sha256"] == manifest["run"]["pins"]["start model"]["sha256"]

    shutil.copytree(a / "checkpoint", b / "checkpoint")  # run A's checkpoints in run B's dir
    with pytest.raises(ConfigError, match=r"belongs to another run: .*run_dir='.*/a'.*this is run_dir='.*/b'.*"
                                          r"training\.seed: 0 -> 7"):
        run(compose_tiny_run(b, *TINY_GRPO_OVERRIDES, "training.steps=3", "training.seed=7"))

    # The same run continued from another cache whose entry under the same key holds other weights
    cache = Path(os.environ["REFEXP_CACHE"])
    other = tmp_path / "other-cache"
    shutil.copytree(cache, other, ignore=shutil.ignore_patterns("*.lock"))
    key = read_status(a)["sft_start"]["key"]
    _flip_a_byte(next((other / "sft" / key / "model").glob("*.distcp")))
    from refexp.record.cache_dirs import write_entry_manifest

    write_entry_manifest(other / "sft" / key)  # another model, sealed as its writer would (else: refused as corrupt)
    status = (a / "status.json").read_bytes()
    with pytest.raises(ConfigError, match=rf"the start model this run began from is {cache}/sft/{key} .*and it is "
                                          rf"now {other}/sft/{key} .*other weights"):
        run(compose_tiny_run(a, *TINY_GRPO_OVERRIDES, "training.steps=3", f"sft.cache_dir={other}"))
    assert (a / "status.json").read_bytes() == status


@pytest.mark.slow
def test_a_resume_from_an_sft_entry_with_another_models_files_planted_is_refused_before_loading(tmp_path, monkeypatch):
    """Another model's config.json and model.safetensors copied into the SFT cache entry a preempted run began from
    (which the loader would read as an HF dir, beside the entry's own ``model/``): the resume is refused in one line
    naming the entry and the files, before any weights are loaded, and the run's record is kept."""
    import refexp.titan.checkpoint_dirs as checkpoint_dirs
    from refexp.record.cache_dirs import CorruptCacheEntry

    cache = tmp_path / "cache"  # its own: the planted files must not reach the session's other runs
    monkeypatch.setenv("REFEXP_CACHE", str(cache))
    a = tmp_path / "a"
    run(compose_tiny_run(a, *TINY_GRPO_OVERRIDES, "training.steps=2"))
    entry = cache / "sft" / read_status(a)["sft_start"]["key"]
    for name in ("config.json", "model.safetensors"):  # an HF model of the same shapes, other weights
        shutil.copy(entry / "hf" / name, entry / name)
    _flip_a_byte(entry / "model.safetensors")
    record = {name: (a / name).read_bytes() for name in ("status.json", "metrics.jsonl")}

    def loaded(*args, **kwargs):
        raise AssertionError("weights were loaded from an entry that does not verify")

    monkeypatch.setattr(checkpoint_dirs, "load_hf_weights_", loaded)
    monkeypatch.setattr(checkpoint_dirs, "load_model_weights", loaded)
    with pytest.raises(CorruptCacheEntry) as e:
        run(compose_tiny_run(a, *TINY_GRPO_OVERRIDES, "training.steps=3"))
    msg = str(e.value)
    assert "\n" not in msg and str(entry) in msg and "config.json, model.safetensors not in its manifest" in msg
    assert {name: (a / name).read_bytes() for name in record} == record
