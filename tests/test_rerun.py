"""Rerunning a run dir resumes it, so a changed configuration is refused before anything is built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from refexp.config import ConfigError
from refexp.config.diff import changed_fields, flatten
from refexp.record.metrics import read_metrics
from refexp.record.status import read_status
from refexp.run import run
from tests.helpers.configs import TINY_GRPO_OVERRIDES, compose_tiny_run


def test_flatten_and_changed_fields():
    old = {"training": {"lr": 1e-3, "steps": 4}, "logger": {"project": "a"}, "algo": {"name": "grpo", "x": [1]},
           "parallelism": {"nproc_per_node": 2}}
    new = {"training": {"lr": 2e-3, "steps": 8, "new_field": 1}, "logger": {"project": "b"},
           "algo": {"name": "grpo", "x": [1, 2]}, "parallelism": {"nproc_per_node": 1}}
    assert flatten(old)["algo.x"] == [1]
    assert changed_fields(old, new) == {"algo.x": ([1], [1, 2]), "training.lr": (1e-3, 2e-3)}


def test_a_run_recorded_under_a_renamed_choice_resumes_under_its_new_name():
    """A continued-SFT run dir recorded before ``algo.objective: sft`` became ``continued_sft`` (refexp/choices.py:
    RENAMED_CHOICES) is the same run to a rerun that says ``continued_sft``; another objective is still a change."""
    old = {"algo": {"name": "grpo", "objective": "sft"}}
    assert changed_fields(old, {"algo": {"name": "grpo", "objective": "continued_sft"}}) == {}
    assert changed_fields(old, {"algo": {"name": "grpo", "objective": "grpo"}}) == {
        "algo.objective": ("continued_sft", "grpo")}


def test_a_path_into_the_cache_dir_compares_by_its_place_in_the_cache():
    """``model.pretrained``'s converted dir lies in the cache (``model.hf_assets_path``): with a copied cache
    (another ``sft.cache_dir``, a resumable change) it is the same entry; another entry, or a path outside the
    cache, is still a change. The run identity's hash follows."""
    from refexp.components.run_identity import run_identity

    def config(cache: str, hf: str, funcs=()):
        return {"sft": {"cache_dir": cache}, "model": {"hf_assets_path": hf}, "task": {"reward_funcs": list(funcs)}}

    old = config("/a/cache", "/a/cache/pretrained/smollm2_135m-bcc8-v1", ["/a/cache/rm/k/hf"])
    copied = config("/b/cache/", "/b/cache/pretrained/smollm2_135m-bcc8-v1", ["/b/cache/rm/k/hf"])
    assert changed_fields(old, copied) == {}
    assert run_identity(old, "run")["config_hash"] == run_identity(copied, "run")["config_hash"]
    other = config("/b/cache", "/b/cache/pretrained/smollm2_135m-0000-v1", ["/b/cache/rm/k/hf"])
    assert changed_fields(old, other) == {"model.hf_assets_path": ("${sft.cache_dir}/pretrained/smollm2_135m-bcc8-v1",
                                                                   "${sft.cache_dir}/pretrained/smollm2_135m-0000-v1")}
    outside = config("/b/cache", "/a/cache/pretrained/smollm2_135m-bcc8-v1", ["/b/cache/rm/k/hf"])
    assert list(changed_fields(old, outside)) == ["model.hf_assets_path"]
    home = config("~/cache", str(Path.home() / "cache" / "pretrained" / "x"))  # ensure_pretrained expands ~
    assert changed_fields(home, config("/b/cache", "/b/cache/pretrained/x")) == {}


def test_changed_config_is_refused_and_steps_resume(tmp_path, dense_reward, monkeypatch):
    run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, "training.steps=2"))
    status = (tmp_path / "status.json").read_text()

    import refexp.components.models

    def no_build(*a, **k):
        raise AssertionError("a model was built for a refused rerun")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(refexp.components.models, "build_run_model", no_build)
        with pytest.raises(ConfigError, match=r"Changed: task\.num_eval: 64 -> 32; training\.lr: 0\.001 -> 0\.002\."):
            run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, "training.steps=5", "training.lr=2e-3",
                                 "task.num_eval=32"))
    assert (tmp_path / "status.json").read_text() == status  # the run's own record is untouched

    first = json.loads(status)
    import refexp.run

    monkeypatch.setattr(refexp.run, "provenance", lambda: {"commit": "resumed-with"})
    final = run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, "training.steps=3", "logger.progress=true"))
    assert final["step"] == 3
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2, 3]
    resumed = read_status(tmp_path)
    assert resumed["status"] == "completed"
    # the wall time counts both invocations (the report's setup block reads it), not the last one alone
    assert first["wall_s"] == pytest.approx(first["ended"] - first["started"])
    assert resumed["wall_s"] == pytest.approx(first["wall_s"] + resumed["ended"] - resumed["started"])
    # every code version that computed part of the run; a re-run of the finished run computed nothing
    assert resumed["provenances"] == [first["provenance"], {"commit": "resumed-with"}]
    monkeypatch.setattr(refexp.run, "provenance", lambda: {"commit": "a-no-op-rerun"})
    run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, "training.steps=3"))
    again = read_status(tmp_path)
    assert again["status"] == "completed" and again["provenances"] == resumed["provenances"]
