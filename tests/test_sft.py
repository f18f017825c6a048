"""The SFT stage: the loss goes down, the result is cached by config hash and reused, weights round-trip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from refexp import titan
from refexp.config import ModelConfig
from refexp.record.metrics import read_metrics
from refexp.run import run
from refexp.titan import load_model_weights, save_model_weights
from tests.helpers.configs import TINY_RUN_OVERRIDES, compose_tiny_run


def test_sft_loss_decreases_and_the_result_is_reused(tmp_path, monkeypatch):
    final = run(compose_tiny_run(tmp_path / "a", "algo=sft", "sft.steps=40", "sft.eval_every=20"))
    sft_dir = Path(final["sft/dir"])
    assert (sft_dir / "sft.json").is_file() and (sft_dir / "model" / ".metadata").is_file()
    assert (sft_dir / "hf" / "config.json").is_file() and (sft_dir / "tokenizer.json").is_file()
    losses = [r["loss/total"] for r in read_metrics(sft_dir) if "loss/total" in r]
    assert len(losses) == 40
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5
    # the run dir carries the stage's curve too
    assert [r["step"] for r in read_metrics(tmp_path / "a")][0] == 0

    import refexp.algos.sft as sft_mod

    def must_not_train(*a, **k):
        raise AssertionError("an identical SFT config must reuse the cached result")

    monkeypatch.setattr(sft_mod, "train_sft", must_not_train)
    again = run(compose_tiny_run(tmp_path / "b", "algo=sft", "sft.steps=40", "sft.eval_every=20"))
    assert again["sft/dir"] == str(sft_dir)
    with pytest.raises(AssertionError, match="reuse"):  # a different config is a different SFT model
        run(compose_tiny_run(tmp_path / "c", "algo=sft", "sft.steps=41", "sft.eval_every=20"))


def test_two_sft_seeds_train_two_independent_starts_that_runs_record(tmp_path):
    """``sft.seed`` is a factor of a sweep: each value is its own cache entry (another init and batch order, so
    other weights), and a run's ``status.json`` names the entry it started from (what the report groups by)."""
    from refexp.record.status import read_status
    from refexp.report.reading.load import load_run

    dirs = []
    for seed in (0, 1):
        final = run(compose_tiny_run(tmp_path / str(seed), "algo=sft", "sft.steps=4", f"sft.seed={seed}"))
        dirs.append(Path(final["sft/dir"]))
        assert read_status(tmp_path / str(seed))["sft_start"]["key"] == dirs[-1].name
        assert load_run(tmp_path / str(seed), tmp_path).sft_start == dirs[-1].name
    assert dirs[0] != dirs[1] and all((d / "sft.json").is_file() for d in dirs)
    first_losses = [next(r["loss/total"] for r in read_metrics(d) if "loss/total" in r) for d in dirs]
    assert first_losses[0] != first_losses[1]  # another init and first batch from the first step on


def test_model_weights_round_trip_through_dcp(tmp_path):
    titan.prepare_torchtitan("cpu")
    cfg = ModelConfig(dim=32, n_layers=2, n_heads=2, n_kv_heads=2, ffn_hidden_dim=64, max_seq_len=32)
    a = titan.build_model(cfg, vocab_size=17, device="cpu", seed=1)
    b = titan.build_model(cfg, vocab_size=17, device="cpu", seed=2)
    save_model_weights(a, tmp_path / "model")
    load_model_weights(b, tmp_path / "model")
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
    tokens = torch.randint(0, 17, (2, 9))
    torch.testing.assert_close(titan.token_logprobs(a, tokens), titan.token_logprobs(b, tokens), rtol=0, atol=0)


def test_best_weights_puts_back_the_saved_shards_of_a_sharded_model():
    """BestWeights on DTensor parameters (bf16 compute: FSDP on a 1-rank mesh) restores the values it saved."""
    from torch.distributed.tensor import DTensor

    from refexp.algos.sft import BestWeights
    from refexp.config import TrainingConfig

    titan.prepare_torchtitan("cpu")
    cfg = ModelConfig(dim=32, n_layers=1, n_heads=2, n_kv_heads=2, ffn_hidden_dim=64, max_seq_len=32)
    bf16 = TrainingConfig(mixed_precision_param="bfloat16")
    model = titan.build_model(cfg, vocab_size=17, device="cpu", seed=1, training_cfg=bf16)
    assert all(isinstance(p, DTensor) for p in model.parameters())
    saved = [p.to_local().clone() for p in model.parameters()]
    best = BestWeights(model)
    best.save(step=3)
    titan.lerp_weights_(model, titan.build_model(cfg, vocab_size=17, device="cpu", seed=2, training_cfg=bf16), 1.0)
    assert not all(torch.equal(p.to_local(), s) for p, s in zip(model.parameters(), saved))
    best.restore()
    assert best.step == 3
    assert all(torch.equal(p.to_local(), s) for p, s in zip(model.parameters(), saved))


def test_missing_checkpoint_dir_is_a_clear_error(tmp_path):
    from refexp.config import ConfigError

    titan.prepare_torchtitan("cpu")
    cfg = ModelConfig(dim=32, n_layers=1, n_heads=2, n_kv_heads=2, ffn_hidden_dim=64, max_seq_len=32)
    m = titan.build_model(cfg, vocab_size=17, device="cpu")
    with pytest.raises(ConfigError, match="does not exist"):
        load_model_weights(m, tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no DCP checkpoint"):
        load_model_weights(m, tmp_path / "empty")


@pytest.mark.slow
def test_concurrent_jobs_train_the_sft_model_once(tmp_path):
    """Two processes asking for the same SFT model at once: one trains, the other waits and reuses it."""
    cache = tmp_path / "cache"
    env = {**os.environ, "REFEXP_CACHE": str(cache)}
    cmd = [sys.executable, "-m", "refexp", *TINY_RUN_OVERRIDES, "algo=sft", "sft.steps=20", "sft.eval_every=20"]
    procs = [subprocess.Popen(cmd + [f"hydra.run.dir={tmp_path / str(i)}"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    dirs = [d for d in (cache / "sft").iterdir() if d.is_dir()]
    assert len(dirs) == 1, dirs  # no leftover temporary dirs, one result
    assert json.loads((dirs[0] / "sft.json").read_text())["steps"] == 20
    assert len(read_metrics(dirs[0])) == 21  # trained once: steps 0..20
