"""The reward-model stage's sources (``rm.temperatures``, ``rm.policies``: refexp/algos/rm_sources.py) and its
held-out accuracy with an interval over prompts (refexp/algos/rm_accuracy.py): the sources mixed into one split by
prompt and counted in ``rm.json``; the cache key changing with each new field; a bad policy named before anything
samples; the interval's arithmetic by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from refexp.algos import rm_sources
from refexp.algos.rm import rm_fingerprint
from refexp.algos.rm_accuracy import prompt_interval
from refexp.config import ConfigError
from refexp.config.root import to_object
from refexp.run import run
from tests.helpers.configs import SMALL_GRPO_OVERRIDES, compose_root, compose_small_run

pytest.importorskip("transformers")

RM_STAGE = ["algo=rm", "rm.num_samples=64", "rm.samples_per_prompt=4", "rm.steps=4", "rm.batch_size=16",
            "rm.eval_every=2"]


def test_the_sources_are_mixed_into_one_split_by_prompt_and_counted_in_rm_json(tmp_path, monkeypatch):
    # a GRPO run that exports its policy: rm.policies names the run dir, which resolves to its checkpoint/hf
    policy_run = tmp_path / "grpo"
    run(compose_small_run(policy_run, *SMALL_GRPO_OVERRIDES, "training.steps=2", "checkpoint.last_save_in_hf=true"))
    sampled, split = [], {}
    original_sample, original_split = rm_sources._sample, rm_sources.labelled_samples

    def spy_sample(ctx, model_dir, prompts, keys, temperature):
        texts, stopped = original_sample(ctx, model_dir, prompts, keys, temperature)
        stopped = [st and i % 2 == 1 for i, st in enumerate(stopped)]  # as if cut off: the small model never is
        sampled.append({"dir": Path(model_dir), "temperature": temperature, "prompts": prompts, "texts": texts,
                        "stopped": stopped})
        return texts, stopped

    def spy_split(ctx, sft_dir):
        split["train"], split["val"], per_source = original_split(ctx, sft_dir)
        split["sft_dir"] = Path(sft_dir)
        return split["train"], split["val"], per_source

    monkeypatch.setattr(rm_sources, "_sample", spy_sample)
    monkeypatch.setattr("refexp.algos.rm.labelled_samples", spy_split)
    final = run(compose_small_run(tmp_path / "rm", *RM_STAGE, "rm.temperatures=[0.7,1.5]",
                                  f"rm.policies=[{policy_run}]"))
    summary = json.loads((Path(final["rm/dir"]).parent / "rm.json").read_text())

    export = (policy_run / "checkpoint" / "hf").resolve()
    assert [(s["dir"], s["temperature"]) for s in sampled] == [
        (split["sft_dir"], 0.7), (split["sft_dir"], 1.5), (export, 0.7), (export, 1.5)]
    assert [(s["model"], s["temperature"]) for s in summary["sources"]] == [
        ("start", 0.7), ("start", 1.5), (str(export), 0.7), (str(export), 1.5)]
    # 64 samples shared by 4 sources: 4 prompts x 4 samples each, every source with one held-out prompt
    assert [s["samples"] for s in summary["sources"]] == [16] * 4
    assert [s["prompts"] for s in summary["sources"]] == [4] * 4
    assert summary["train_samples"] + summary["val_samples"] == 64 and summary["val_prompts"] == 4
    train, val = split["train"], split["val"]
    assert sorted(set(train["sources"])) == sorted(set(val["sources"])) == [0, 1, 2, 3]
    assert not set(train["prompt_ids"]) & set(val["prompt_ids"])  # split by prompt
    sources_of = {}
    for part in (train, val):
        for pid, si in zip(part["prompt_ids"], part["sources"]):
            sources_of.setdefault(pid, set()).add(si)
    assert all(len(s) == 1 for s in sources_of.values()) and len(sources_of) == 16  # each prompt is one source's

    # each source's record is its own samples' verifier labels and formats, and its samples are in the split
    for si, (record, s) in enumerate(zip(summary["sources"], sampled)):
        mine = [(p, c, float(y)) for part in (train, val)
                for p, c, y, src in zip(part["prompts"], part["completions"], part["labels"], part["sources"])
                if src == si]
        assert sorted((p, c) for p, c, _ in mine) == sorted(zip(s["prompts"], s["texts"]))
        assert record["positive_rate"] == pytest.approx(sum(y for *_, y in mine) / len(mine))
        width = {p: len(p.split("+")[0]) + 1 for p in s["prompts"]}  # the small task's 1-digit sums: 2 digits
        bad = [not (st and t.isdigit() and len(t) == width[p])
               for p, t, st in zip(s["prompts"], s["texts"], s["stopped"])]
        assert record["format_invalid"] == pytest.approx(sum(bad) / len(bad))
        assert 0.0 <= record["val_accuracy"] <= 1.0
    weights = [s["samples"] for s in summary["sources"]]
    assert summary["positive_rate"] == pytest.approx(
        sum(w * s["positive_rate"] for w, s in zip(weights, summary["sources"])) / sum(weights))
    lo, hi = summary["val_accuracy_interval"]
    assert lo <= summary["val_accuracy"] <= hi
    assert summary["val_accuracy"] == pytest.approx(
        sum(s["val_accuracy"] for s in summary["sources"]) / 4)  # one held-out prompt of each, equal samples


def _fingerprint(tmp_path: Path, *overrides: str) -> str:
    """``rm_fingerprint`` of the root config with ``overrides``, over a fixed start dir."""
    cfg = to_object(compose_root("algo=rm", *overrides))
    ctx = SimpleNamespace(cfg=cfg, task=SimpleNamespace(max_new_tokens=cfg.task.max_new_tokens))
    start = tmp_path / "start"
    start.mkdir(exist_ok=True)
    return rm_fingerprint(ctx, start)


def _hf_export(path: Path, weights: bytes) -> Path:
    """A dir that reads as an HF export (config.json beside a safetensors file) with these weight bytes."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(weights)
    return path


def test_the_cache_key_changes_with_the_temperatures_and_the_policies_and_their_weights(tmp_path):
    a, b = _hf_export(tmp_path / "a", b"policy a"), _hf_export(tmp_path / "b", b"policy b")
    keys = {
        "default": _fingerprint(tmp_path),
        "one temperature": _fingerprint(tmp_path, "rm.temperatures=[0.7]"),
        "three temperatures": _fingerprint(tmp_path, "rm.temperatures=[0.7,1.0,1.5]"),
        "their order": _fingerprint(tmp_path, "rm.temperatures=[1.5,1.0,0.7]"),
        "a policy": _fingerprint(tmp_path, f"rm.policies=[{a}]"),
        "another policy": _fingerprint(tmp_path, f"rm.policies=[{b}]"),
        "both": _fingerprint(tmp_path, f"rm.policies=[{a},{b}]"),
    }
    assert len(set(keys.values())) == len(keys), keys
    assert _fingerprint(tmp_path, "rm.temperatures=[1.0]") == keys["default"]  # the default spelled out
    assert _fingerprint(tmp_path, f"rm.policies=[{a}]") == keys["a policy"]  # the same weights: the same proxy
    _hf_export(a, b"policy a, trained further")  # re-exported under the same path: another proxy, never a stale one
    assert _fingerprint(tmp_path, f"rm.policies=[{a}]") != keys["a policy"]


def test_a_bad_policy_is_one_error_naming_its_entry_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(rm_sources, "_sample", lambda *a, **k: pytest.fail("sampled before the check"))
    good = _hf_export(tmp_path / "good", b"w")
    not_export = tmp_path / "empty"
    not_export.mkdir()
    run_without_export = tmp_path / "run-without-export"
    run_without_export.mkdir()
    (run_without_export / "resolved_config.yaml").write_text("checkpoint:\n  folder: ckpt\n")
    cases = [
        ([str(tmp_path / "missing")], r"rm\.policies\[0\]=.*missing' is not a directory: expected a policy's HF "
                                      r"export"),
        ([str(good), str(not_export)], r"rm\.policies\[1\]=.*empty' holds no config\.json and \*\.safetensors"),
        ([str(run_without_export)], r"rm\.policies\[0\]=.* is a run dir without an HF export \(ckpt/hf .*"
                                    r"checkpoint\.last_save_in_hf=true"),
    ]
    for i, (policies, message) in enumerate(cases):
        run_dir = tmp_path / f"run{i}"
        with pytest.raises(ConfigError, match=message) as e:
            run(compose_small_run(run_dir, *RM_STAGE, f"rm.policies=[{','.join(policies)}]"))
        assert "\n" not in str(e.value)
        assert not (run_dir / "status.json").exists()  # refused in validate: no stage started, nothing sampled


def test_a_policy_of_another_shape_is_one_error_naming_its_entry_and_the_field_before_anything_runs(tmp_path):
    """A policy's weights load into the run's model only where its config.json has the run's shapes: a mismatch is
    refused in validate (no SFT stage, no sampling), naming the entry and the shape that differs."""
    import dataclasses

    import torch

    from refexp.run import validate
    from refexp.titan.hf_config import write_hf_config
    from refexp.titan.spec import model_arch

    dcfg = compose_small_run(tmp_path / "run", *RM_STAGE)
    cfg = to_object(dcfg)
    arch = model_arch(cfg.model, vocab_size=64)

    def export(name: str, arch) -> str:
        d = tmp_path / name
        write_hf_config(str(_hf_export(d, b"w")), cfg.model.name, arch, torch.float32)
        return str(d)

    same = export("same", arch)
    deeper = export("deeper", dataclasses.replace(arch, n_layers=arch.n_layers + 1))
    validate(compose_small_run(tmp_path / "run", *RM_STAGE, f"rm.policies=[{same}]"))  # this run's shapes: accepted
    with pytest.raises(ConfigError, match=rf"rm\.policies\[1\]='.*deeper': its config\.json is not this run's model: "
                                          rf"n_layers {arch.n_layers + 1} \(this run: {arch.n_layers}\)") as e:
        run(compose_small_run(tmp_path / "run", *RM_STAGE, f"rm.policies=[{same},{deeper}]"))
    assert "\n" not in str(e.value) and not (tmp_path / "run" / "status.json").exists()


def test_bad_temperatures_are_one_error_naming_the_field(tmp_path, capsys):
    from refexp.cli.errors import precheck
    from tests.helpers.configs import CONF_DIR

    with pytest.raises(SystemExit):  # the old field on the command line: one line naming its replacement
        precheck(["algo=rm", "rm.temperature=0.7", f"hydra.run.dir={tmp_path / 'run'}"], str(CONF_DIR))
    assert "refexp: error: rm.temperature is not a field of RMStageConfig: replaced by rm.temperatures" in \
        capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"rm\.temperature is not a field of rm: replaced by rm\.temperatures"):
        to_object(compose_root("+rm.temperature=0.7"))
    with pytest.raises(ConfigError, match=r"rm\.temperatures\[\]=0\.0 is invalid: expected a number > 0"):
        to_object(compose_root("rm.temperatures=[0.7,0.0]"))
    with pytest.raises(ConfigError, match=r"rm\.temperatures=\[\] is invalid: expected a non-empty list"):
        to_object(compose_root("rm.temperatures=[]"))
    with pytest.raises(ConfigError, match=r"rm\.temperatures=\[1\.0, 1\.0\] is invalid: expected distinct"):
        to_object(compose_root("rm.temperatures=[1.0,1.0]"))
    with pytest.raises(ConfigError, match=r"rm\.num_samples=16 is invalid: expected at least 2 x "
                                          r"rm\.samples_per_prompt=4 x the 3 sources"):
        to_object(compose_root("rm.num_samples=16", "rm.temperatures=[0.7,1.0,1.5]"))


def test_well_formed_is_the_embedded_tasks_zero_padded_digits_then_the_stop_token():
    assert rm_sources.well_formed("arithmetic", "0359", stopped=True, demonstration="0359")
    assert rm_sources.well_formed("arithmetic", "1000", stopped=True, demonstration="0359")  # wrong, well formed
    assert not rm_sources.well_formed("arithmetic", "0359", stopped=False, demonstration="0359")  # cut off
    assert not rm_sources.well_formed("arithmetic", "11986", stopped=True, demonstration="1191")  # another width
    assert not rm_sources.well_formed("arithmetic", "359", stopped=True, demonstration="0359")
    assert not rm_sources.well_formed("arithmetic", "03+9", stopped=True, demonstration="0359")
    assert not rm_sources.well_formed("arithmetic", "", stopped=True, demonstration="0359")
    assert not rm_sources.well_formed("arithmetic", "٣٥٩٠", stopped=True, demonstration="0359")  # non-ASCII digits
    assert rm_sources.well_formed("gsm8k", "#### 5", stopped=True, demonstration="#### 5") is None  # not recorded


def test_the_held_out_interval_is_students_t_over_per_prompt_accuracies():
    # six prompts of four samples, interleaved: per-prompt accuracies 0.5, 0.75, 0.75, 0.5, 0.75, 0.5
    per_prompt = {"a": [1, 0, 1, 0], "b": [1, 1, 1, 0], "c": [0, 1, 1, 1], "d": [0, 0, 1, 1], "e": [1, 1, 0, 1],
                  "f": [1, 0, 0, 1]}
    correct, ids = [], []
    for j in range(4):
        for p, outcomes in per_prompt.items():
            correct.append(outcomes[j])
            ids.append(p)
    got = prompt_interval(correct, ids)
    # by hand: mean 0.625; every deviation ±0.125, so s = sqrt(6 x 0.015625 / 5) = 0.136931; s/√6 = 0.0559017;
    # t_{0.975, 5} = 2.570582 (tables); half-width 0.143699
    assert got["accuracy"] == pytest.approx(0.625)
    assert got["interval"] == pytest.approx([0.625 - 0.143699, 0.625 + 0.143699], abs=1e-6)
    assert got["prompts"] == 6 and got["samples"] == 24
    # over the 24 samples as if independent, the binomial half-width 1.96·sqrt(p(1-p)/24) = 0.1937 would differ:
    # the unit is the prompt, not the sample
    assert got["interval"][1] - got["interval"][0] != pytest.approx(2 * 1.96 * math.sqrt(0.625 * 0.375 / 24), abs=1e-3)
    # clipped to [0, 1]; one prompt has no spread to measure
    assert prompt_interval([1, 1, 1, 1, 0, 1], ["a", "a", "b", "b", "c", "c"])["interval"][1] == 1.0
    assert prompt_interval([1, 0, 1], ["a", "a", "a"]) == {"accuracy": pytest.approx(2 / 3), "interval": None,
                                                           "prompts": 1, "samples": 3}
