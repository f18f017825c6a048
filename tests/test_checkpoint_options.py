"""Checkpoint disk options: ``checkpoint.save_reference`` and ``checkpoint.last_save_model_only``
(refexp/components/checkpoint.py). Leaving state out must never make a resume silently inexact: it resumes from
what is complete, or is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from refexp.components.checkpoint import is_model_only
from refexp.config import ConfigError
from refexp.record.metrics import read_metrics
from refexp.run import run
from tests.helpers.configs import TINY_GRPO_OVERRIDES, compose_tiny_run


def _size(path: Path) -> int:
    """The bytes of a checkpoint's state (its manifest, which also records the run's config, left out)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and p.name != "refexp-manifest.json")


def _steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_metrics(run_dir)]


def test_model_only_final_save_resumes_from_the_last_full_checkpoint(tmp_path, dense_reward):
    common = [*TINY_GRPO_OVERRIDES, "checkpoint.interval=2", "checkpoint.last_save_model_only=true"]
    run(compose_tiny_run(tmp_path, *common, "training.steps=3"))
    ck = tmp_path / "checkpoint"
    assert is_model_only(ck / "step-3") and not is_model_only(ck / "step-2")
    assert _size(ck / "step-3") < _size(ck / "step-2") / 2  # no AdamW moments (2 x the weights)
    final = run(compose_tiny_run(tmp_path, *common, "training.steps=4"))  # continues from step-2
    assert final["step"] == 4 and _steps(tmp_path) == [0, 1, 2, 3, 4]
    assert is_model_only(ck / "step-4")


def test_only_a_model_only_checkpoint_is_refused(tmp_path, dense_reward):
    # interval 100: the final save is the only one
    common = [*TINY_GRPO_OVERRIDES, "checkpoint.last_save_model_only=true"]
    run(compose_tiny_run(tmp_path, *common, "training.steps=2"))
    with pytest.raises(ConfigError, match="holds only a model-only checkpoint"):
        run(compose_tiny_run(tmp_path, *common, "training.steps=3"))


def test_reference_weights_left_out_refuse_a_resume_after_the_reference_moved(tmp_path, dense_reward):
    ema = ["reference=ema", "reference.alpha=0.5"]
    run(compose_tiny_run(tmp_path / "saved", *TINY_GRPO_OVERRIDES, *ema, "training.steps=2"))
    run(compose_tiny_run(tmp_path / "lean", *TINY_GRPO_OVERRIDES, *ema, "training.steps=2",
                         "checkpoint.save_reference=false"))
    saved, lean = _size(tmp_path / "saved/checkpoint/step-2"), _size(tmp_path / "lean/checkpoint/step-2")
    assert lean < saved * 0.85  # weights 1/4 of policy + AdamW + reference
    with pytest.raises(ConfigError, match=r"checkpoint.save_reference=false: reference=ema moved"):
        run(compose_tiny_run(tmp_path / "lean", *TINY_GRPO_OVERRIDES, *ema, "training.steps=3",
                             "checkpoint.save_reference=false"))


def test_reference_weights_left_out_resume_while_the_reference_has_not_moved(tmp_path, dense_reward):
    reset = ["reference=periodic_reset", "reference.reset_every=4", "checkpoint.save_reference=false"]
    run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, *reset, "training.steps=2"))
    # version 0: the start weights
    final = run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, *reset, "training.steps=3"))
    assert final["step"] == 3 and _steps(tmp_path) == [0, 1, 2, 3]


def test_keep_latest_k_of_one_is_a_config_error():
    from refexp.config.runtime import CheckpointConfig

    with pytest.raises(ConfigError, match="checkpoint.keep_latest_k=1 is invalid"):
        CheckpointConfig(keep_latest_k=1)
