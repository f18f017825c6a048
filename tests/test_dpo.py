"""DPO end to end on the embedded task: on-policy preference pairs, every loss x reference pairing the
sweep uses, the reference cache, and the config check that reference=none needs a reference-free loss.

Runs compose the real config (Hydra's compose API) and call ``refexp.run.run``; a tiny llama3
(dim 32) with an untrained "SFT" model (``sft.target_accuracy=0``) keeps each run to seconds.
"""

import json
import os
from pathlib import Path

import pytest

from refexp import titan
from refexp.algos.dpo_data import pairs_dir, sample_pairs
from refexp.config import ConfigError, ModelConfig, TaskConfig
from refexp.record.metrics import read_metrics
from refexp.record.status import read_status
from refexp.run import run
from refexp.tasks import build_task
from tests.helpers.configs import compose_config

# DPO for 3 steps over 64 pairs from an untrained "SFT" model (sft.target_accuracy=0.0).
UNTRAINED_DPO_RUN_OVERRIDES = [
    "algo=dpo", "model=tiny", "model.dim=32", "sft.steps=30", "sft.target_accuracy=0.0", "training.steps=3",
    "eval.every=2", "eval.num_prompts=16", "eval.kl_prompts=8", "logger=none", "logger.progress=false",
    "task.num_train=500", "task.num_eval=50", "algo.num_pairs=64"]
DPO_METRICS = {"loss/total", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
               "logps/chosen", "logps/rejected", "perf/ref_fwd_s", "perf/tokens_per_s", "optim/grad_norm",
               "optim/lr", "ref/version", "perf/step_s", "mem/peak_rss_mb"}


def compose_dpo_run(run_dir: Path, *overrides: str):
    return compose_config(*UNTRAINED_DPO_RUN_OVERRIDES, f"run_dir={run_dir}", *overrides)


def run_dpo(run_dir: Path, *overrides: str) -> tuple[dict, list[dict]]:
    final = run(compose_dpo_run(run_dir, *overrides))
    rows = read_metrics(run_dir)
    assert read_status(run_dir)["status"] == "completed"
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for r in rows[1:]:
        assert DPO_METRICS <= r.keys(), DPO_METRICS - r.keys()
    assert {"eval/accuracy", "kl/init"} <= rows[2].keys() and {"eval/accuracy", "kl/init"} <= rows[3].keys()
    return final, rows


# ---------------------------------------------------------------- preference pairs
def test_pairs_are_deterministic_correct_vs_own_error(tmp_path):
    task = build_task(TaskConfig(num_train=200, num_eval=20), str(tmp_path))
    model = titan.build_model(ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=4, ffn_hidden_dim=64,
                                          max_seq_len=64), vocab_size=task.tokenizer.vocab_size, device="cpu",
                              seed=0, requires_grad=False)
    a = sample_pairs(model, task, num_pairs=40, pair_seed=3, max_new_tokens=task.max_new_tokens)
    b = sample_pairs(model, task, num_pairs=40, pair_seed=3, max_new_tokens=task.max_new_tokens)
    c = sample_pairs(model, task, num_pairs=40, pair_seed=4, max_new_tokens=task.max_new_tokens)
    assert a == b and len(a["prompt"]) == 40
    assert a["rejected"] != c["rejected"]
    for pid, prompt, chosen, rejected in zip(a["prompt_id"], a["prompt"], a["chosen"], a["rejected"]):
        row = task.train[pid]
        assert (prompt, chosen) == (row["prompt"], row["completion"])
        assert task.reward(chosen, row["answer"]) == 1.0 and task.reward(rejected, row["answer"]) < 1.0
    # with a demonstrator that slips, chosen is still the correct completion, never the slipped demonstration
    slipped = build_task(TaskConfig(num_train=200, num_eval=20, demo_slip=1.0), str(tmp_path))
    d = sample_pairs(model, slipped, num_pairs=40, pair_seed=3, max_new_tokens=slipped.max_new_tokens)
    rows = [slipped.train[pid] for pid in d["prompt_id"]]
    assert any(r["completion"] != r["solution"] for r in rows)
    assert d["chosen"] == [r["solution"] for r in rows]
    assert all(slipped.reward(c, r["answer"]) == 1.0 for c, r in zip(d["chosen"], rows))
    # a pair set is stored under the cache dir, one per value of anything in its key
    key = {"task": "t", "start": {"path": "/ckpt", "stamp": []}, "num_pairs": 40, "pair_seed": 3, "max_new_tokens": 8}
    changes = [{}, {"num_pairs": 41}, {"pair_seed": 4}, {"max_new_tokens": 9}, {"task": "u"},
               {"start": {"path": "/other", "stamp": []}}]
    dirs = {pairs_dir(tmp_path, {**key, **c}) for c in changes}
    assert len(dirs) == len(changes) and all(d.parent == tmp_path / "pairs" for d in dirs)


# ---------------------------------------------------------------- end to end
def test_dpo_fixed_reference_live_then_precomputed(tmp_path):
    _, live = run_dpo(tmp_path / "live")
    assert live[1]["kl/ref_chosen_tokens"] == pytest.approx(0.0, abs=1e-6)  # step 1: the policy is the reference
    assert live[1]["loss/total"] == pytest.approx(0.6931472, abs=1e-5)  # -log sigmoid(0)
    assert live[3]["kl/ref_chosen_tokens"] > 0 and live[3]["mem/ref_params"] > 0 and "refcache/hits" not in live[1]
    stored = list(Path(os.environ["REFEXP_CACHE"]).glob("pairs/*/pairs.json"))
    assert any(json.loads(p.read_text())["made"] == 64 for p in stored)  # in the cache, not the SFT dir
    assert not list(Path(os.environ["REFEXP_CACHE"]).glob("sft/*/pairs-*"))

    _, first = run_dpo(tmp_path / "a", "algo.precompute_ref=true")
    _, second = run_dpo(tmp_path / "b", "algo.precompute_ref=true")
    assert first[1]["refcache/built"] == 1.0 and second[1]["refcache/built"] == 0.0  # the 2nd run read the file
    for r in first[1:] + second[1:]:  # every lookup a hit; the reference model is not held
        assert (r["refcache/hits"], r["refcache/misses"], r["mem/ref_params"]) == (16.0, 0.0, 0.0)
    for cached, live_row in zip(second[1:], live[1:]):  # cached reference log-probs train exactly like live ones
        assert cached["loss/total"] == pytest.approx(live_row["loss/total"], abs=1e-5)
        assert cached["kl/ref_chosen_tokens"] == pytest.approx(live_row["kl/ref_chosen_tokens"], abs=1e-5)
    assert second[3]["kl/init"] == pytest.approx(live[3]["kl/init"], abs=1e-5)  # anchor rebuilt for kl/init


@pytest.mark.parametrize("loss", ["simpo", "orpo"])
def test_dpo_reference_free_losses_hold_no_reference(tmp_path, loss):
    _, rows = run_dpo(tmp_path / loss, "reference=none", f"algo.loss_type={loss}")
    for r in rows[1:]:
        assert r["mem/ref_params"] == 0.0 and "kl/ref" not in r and "kl/ref_chosen_tokens" not in r
    if loss == "orpo":
        assert {"loss/nll", "loss/or"} <= rows[1].keys()


def test_dpo_periodic_reset_invalidates_the_reference_cache(tmp_path):
    _, rows = run_dpo(tmp_path / "reset", "reference=periodic_reset", "reference.reset_every=2",
                      "algo.precompute_ref=true")
    assert [r["ref/version"] for r in rows[1:]] == [0.0, 1.0, 1.0]  # reset after step 2
    assert [r["refcache/misses"] for r in rows[1:]] == [16.0, 16.0, 16.0]  # distinct pairs every step
    assert rows[3]["kl/ref_chosen_tokens"] == pytest.approx(0.0, abs=1e-6)  # the reference was just reset
    assert rows[3]["loss/total"] == pytest.approx(0.6931472, abs=1e-5)


def test_reference_none_needs_a_reference_free_loss(tmp_path):
    with pytest.raises(ConfigError, match="reference=none needs a reference-free loss"):
        run(compose_dpo_run(tmp_path / "bad", "reference=none", "algo.loss_type=sigmoid"))
    assert not (tmp_path / "bad").exists()  # failed in validation, before any model or file


# ---------------------------------------------------------------- the sweep
def test_compare_refs_dpo_sweeps_every_variant_and_seed(tmp_path):
    hydra_cfg = compose_config("experiment=compare_refs_dpo", return_hydra_config=True).hydra
    params = hydra_cfg.sweeper.params
    assert params["dpo_variant"].split(",") == ["fixed", "periodic_reset", "ema", "simpo", "orpo", "rpo", "nll_only"]
    assert params["training.seed"].split(",") == ["0", "1", "2"]


@pytest.mark.parametrize("variant, reference, loss", [
    ("fixed", "fixed", "sigmoid"), ("periodic_reset", "periodic_reset", "sigmoid"), ("ema", "ema", "sigmoid"),
    ("simpo", "none", "simpo"), ("orpo", "none", "orpo"), ("rpo", "fixed", "sigmoid"), ("nll_only", "none", "sft")])
def test_compare_refs_dpo_composes_every_variant(tmp_path, variant, reference, loss):
    from refexp.config import to_object

    cfg = to_object(compose_config("experiment=compare_refs_dpo", f"dpo_variant={variant}", f"run_dir={tmp_path}"))
    assert (cfg.algo.name, cfg.reference.name, cfg.algo.loss_type) == ("dpo", reference, loss)
    assert cfg.algo.precompute_ref and cfg.training.steps == 200
