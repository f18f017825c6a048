"""Cache entries are sealed with a checksummed manifest and verified before they are read
(refexp/record/cache_dirs.py): a corrupt entry (a file changed, missing or added, or its manifest gone) is refused
in one line naming it, never rebuilt behind the run's back."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from refexp.record.cache_dirs import (
    CorruptCacheEntry,
    entry_digest,
    manifest_path,
    verified_entry,
    write_entry_manifest,
)


def flip_a_byte(f: Path, at: int = -10) -> None:
    """One byte of ``f`` changed in place (same size: only a checksum sees it)."""
    data = bytearray(f.read_bytes())
    data[at] ^= 0x01
    f.write_bytes(bytes(data))


def make_entry(root: Path) -> Path:
    entry = root / "entry"
    (entry / "model").mkdir(parents=True)
    (entry / "model" / "weights.bin").write_bytes(bytes(range(256)) * 4)
    (entry / "done.json").write_text("{}")
    return entry


def test_a_sealed_entry_verifies_and_any_change_to_it_is_refused_in_one_line(tmp_path):
    entry = make_entry(tmp_path)
    write_entry_manifest(entry)
    digest = verified_entry(entry, "SFT model")
    assert digest == entry_digest(entry)
    weights = entry / "model" / "weights.bin"
    flip_a_byte(weights)
    with pytest.raises(CorruptCacheEntry) as e:
        verified_entry(entry, "SFT model")
    msg = str(e.value)
    assert "\n" not in msg and str(entry) in msg and "model/weights.bin" in msg and "sha256" in msg
    weights.write_bytes(weights.read_bytes()[:100])  # truncated
    with pytest.raises(CorruptCacheEntry, match="model/weights.bin has 100 bytes"):
        verified_entry(entry, "SFT model")
    weights.unlink()
    with pytest.raises(CorruptCacheEntry, match="model/weights.bin is missing"):
        verified_entry(entry, "SFT model")


def test_a_one_file_entry_has_its_manifest_beside_it(tmp_path):
    f = tmp_path / "table.pt"
    torch.save({"x": torch.arange(100.0)}, f)
    write_entry_manifest(f)
    assert manifest_path(f) == tmp_path / "table.pt.refexp-manifest.json" and manifest_path(f).is_file()
    verified_entry(f, "reference log-probs")
    flip_a_byte(f, at=len(f.read_bytes()) // 2)
    with pytest.raises(CorruptCacheEntry, match=re.escape(str(f))):
        verified_entry(f, "reference log-probs")


def test_an_entry_without_its_manifest_is_refused_in_one_line_and_not_sealed(tmp_path):
    """Every kind of entry is written with a manifest: one without it (deleted, then a bit flipped) is refused,
    naming what to do, and is not sealed with its damage."""
    entry = make_entry(tmp_path)
    write_entry_manifest(entry)
    manifest_path(entry).unlink()
    flip_a_byte(entry / "model" / "weights.bin")
    with pytest.raises(CorruptCacheEntry) as e:
        verified_entry(entry, "SFT model")
    msg = str(e.value)
    assert "\n" not in msg and str(entry) in msg and "no refexp-manifest.json" in msg and "delete it to rebuild" in msg
    assert not manifest_path(entry).exists()  # not sealed as it is now
    with pytest.raises(CorruptCacheEntry, match="no refexp-manifest.json"):
        verified_entry(entry, "SFT model")  # and refused again


def test_a_file_added_to_a_sealed_entry_is_refused_but_a_datasets_readers_files_are_not(tmp_path):
    """A loader reads what is in the dir (config.json and model.safetensors beside an SFT model's ``model/`` make
    it an HF dir): a file the manifest does not list is refused, naming it; the cache files ``datasets`` writes
    beside a dataset it maps are a reader's, not the entry's."""
    entry = make_entry(tmp_path)
    write_entry_manifest(entry)
    digest = verified_entry(entry, "SFT model")
    for name in ("cache-0123.arrow", "tmpab_c12xy"):
        (entry / name).write_bytes(b"a datasets map cache: a reader's, not the entry's")
    assert verified_entry(entry, "SFT model") == digest
    (entry / "config.json").write_text("{}")
    (entry / "model.safetensors").write_bytes(b"\0" * 64)
    with pytest.raises(CorruptCacheEntry) as e:
        verified_entry(entry, "SFT model")
    msg = str(e.value)
    assert "\n" not in msg and str(entry) in msg and "config.json, model.safetensors not in its manifest" in msg


def test_the_digest_is_the_contents_not_the_path(tmp_path):
    a, b = make_entry(tmp_path / "a"), make_entry(tmp_path / "b")
    write_entry_manifest(a)
    assert entry_digest(a) == entry_digest(b)  # b: hashed, a: from its manifest
    flip_a_byte(b / "model" / "weights.bin")
    assert entry_digest(a) != entry_digest(b)


def test_the_reference_log_prob_table_is_verified_before_it_is_read(tmp_path):
    from refexp.reference import refcache
    from refexp.reference.refcache import RefLogps

    table = RefLogps.from_logprobs(torch.randn(4, 6), torch.ones(4, 6, dtype=torch.bool))
    path = tmp_path / "refcache" / "k.pt"
    refcache.save(table, path)
    assert manifest_path(path).is_file()

    def never():
        raise AssertionError("recomputed: a corrupt table must be refused, not silently replaced")

    flip_a_byte(path, at=len(path.read_bytes()) // 2)
    with pytest.raises(CorruptCacheEntry, match=re.escape(str(path))):
        refcache.load_or_compute(path, never, num_rows=2)


def test_a_cached_reward_model_is_verified_before_transformers_reads_it(tmp_path, monkeypatch):
    import refexp.tasks.reward_model as rm_mod

    entry = tmp_path / "rm" / "key"
    (entry / "hf").mkdir(parents=True)
    (entry / "hf" / "model.safetensors").write_bytes(b"\0" * 64)
    (entry / "rm.json").write_text("{}")
    write_entry_manifest(entry)
    flip_a_byte(entry / "hf" / "model.safetensors")
    monkeypatch.setattr(rm_mod, "load_sequence_classifier",
                        lambda *a, **k: pytest.fail("a corrupt reward model was read"))
    with pytest.raises(CorruptCacheEntry, match="reward model cache entry " + re.escape(str(entry))):
        rm_mod.RewardModel(str(entry / "hf"), field_name="task.reward_model")


def test_generated_task_data_is_sealed_and_verified(tmp_path):
    from refexp.config import TaskConfig
    from refexp.tasks.arithmetic import arithmetic_fingerprint, load_arithmetic

    cfg = TaskConfig(num_train=40, num_eval=8)
    load_arithmetic(cfg, str(tmp_path))
    entry = tmp_path / f"arithmetic-{arithmetic_fingerprint(cfg)}"
    assert manifest_path(entry).is_file()
    listed = json.loads(manifest_path(entry).read_text())["files"]
    victim = entry / next(rel for rel in listed if rel.endswith(".arrow"))
    flip_a_byte(victim, at=len(victim.read_bytes()) // 2)
    with pytest.raises(CorruptCacheEntry, match="arithmetic data"):
        load_arithmetic(cfg, str(tmp_path))


@pytest.mark.slow
def test_a_corrupt_sft_cache_entry_or_one_without_its_manifest_is_refused_never_rebuilt(tmp_path, monkeypatch):
    """The SFT model's entry: sealed when made; a bit flip in its weights refuses the next run (one line); so does
    the same entry without its manifest, which is neither retrained nor sealed."""
    import refexp.algos.sft as sft_mod
    from refexp.run import run
    from tests.helpers.configs import compose_tiny_run

    # its own stage: test_sft_temporaries trains seeds 11 and 12 in the same session cache
    overrides = ("algo=sft", "sft.steps=3", "sft.eval_every=3", "sft.seed=21")
    sft_dir = Path(run(compose_tiny_run(tmp_path / "a", *overrides))["sft/dir"])
    assert manifest_path(sft_dir).is_file()
    digest = verified_entry(sft_dir, "SFT model")

    monkeypatch.setattr(sft_mod, "train_sft", lambda *a, **k: pytest.fail("the cached SFT model was rebuilt"))
    shard = next((sft_dir / "model").glob("*.distcp"))
    original = shard.read_bytes()
    flip_a_byte(shard, at=len(original) // 2)
    with pytest.raises(CorruptCacheEntry) as e:
        run(compose_tiny_run(tmp_path / "b", *overrides))
    assert str(sft_dir) in str(e.value) and shard.name in str(e.value) and "\n" not in str(e.value)

    shard.write_bytes(original)
    manifest_path(sft_dir).unlink()
    assert entry_digest(sft_dir) == digest
    with pytest.raises(CorruptCacheEntry, match=re.escape(str(sft_dir)) + r" is corrupt \(no refexp-manifest.json"):
        run(compose_tiny_run(tmp_path / "c", *overrides))
    assert not manifest_path(sft_dir).exists()


@pytest.mark.slow
def test_the_command_line_names_a_corrupt_entry_in_one_line(tmp_path, monkeypatch):
    """``refexp`` on a corrupt SFT cache entry: exit 2 and one ``refexp: error:`` line naming the entry."""
    import os
    import subprocess
    import sys

    from refexp.run import run
    from tests.helpers.configs import CONF_DIR, TINY_RUN_OVERRIDES, compose_tiny_run

    cache = tmp_path / "cache"
    monkeypatch.setenv("REFEXP_CACHE", str(cache))
    overrides = ("algo=sft", "sft.steps=3", "sft.eval_every=3", "sft.seed=13")
    sft_dir = Path(run(compose_tiny_run(tmp_path / "a", *overrides))["sft/dir"])
    flip_a_byte(sft_dir / "sft.json", at=1)
    env = dict(os.environ, OMP_NUM_THREADS="1", REFEXP_CACHE=str(cache), WANDB_MODE="offline")
    proc = subprocess.run([sys.executable, "-m", "refexp", *TINY_RUN_OVERRIDES, *overrides,
                           f"run_dir={tmp_path / 'b'}"], env=env, capture_output=True, text=True, timeout=300,
                          cwd=CONF_DIR.parent)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("refexp: error:")]
    assert len(errors) == 1 and str(sft_dir) in errors[0] and "sft.json" in errors[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def test_dpo_pairs_are_sealed_and_verified_before_they_are_read(tmp_path, monkeypatch):
    import datasets

    from refexp.algos import dpo_data

    out = tmp_path / "pairs" / "key"
    dpo_data._save_atomic(datasets.Dataset.from_dict({"prompt": ["1+1="] * 8, "chosen": ["2"] * 8,
                                                      "rejected": ["3"] * 8}), out, {"made": 8})
    assert manifest_path(out).is_file()
    monkeypatch.setattr(dpo_data, "pairs_key", lambda ctx, sft_dir: {})
    monkeypatch.setattr(dpo_data, "pairs_dir", lambda cache_dir, key: out)
    monkeypatch.setattr(dpo_data, "build_frozen", lambda *a: pytest.fail("stored pairs were sampled again"))
    ctx = type("Ctx", (), {"task": type("T", (), {"preference": None, "train": None})(), "cache_dir": tmp_path,
                           "cfg": type("C", (), {"algo": None, "task": None})()})()
    victim = next(out.glob("*.arrow"))
    flip_a_byte(victim, at=len(victim.read_bytes()) // 2)
    with pytest.raises(CorruptCacheEntry, match="DPO pairs cache entry " + re.escape(str(out))):
        dpo_data.load_pairs(ctx, tmp_path / "sft")
