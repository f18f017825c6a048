"""Every config composes; bad input fails with a message naming the field, before any model is built."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException

from refexp.config import ConfigError, register_configs, to_object
from refexp.run import validate

CONF = Path(__file__).resolve().parents[1] / "conf"
register_configs()


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=["run_dir=/tmp/refexp-unused", *overrides])


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("group", ["model", "parallelism", "checkpoint", "compile", "comm", "training", "task",
                                   "logger", "algo", "reference"])
def test_every_group_option_composes(group):
    for option in _options(group):
        extra = []
        if option in ("qwen3_0.6b", "llama3_8b"):
            extra = ["model.hf_assets_path=/nonexistent"]
        if group == "task" and option == "gsm8k":
            extra = ["task.train_path=/x.jsonl", "task.tokenizer_path=/tok"]
        cfg = to_object(_compose(f"{group}={option}", *extra))
        assert getattr(cfg, group) is not None


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")))
def test_every_experiment_composes(experiment):
    cfg = _compose(f"experiment={experiment}")
    assert cfg.experiment_name == experiment
    to_object(cfg)


@pytest.mark.parametrize("override, field", [
    ("training.steps=-1", "training.steps"),
    ("algo=grpo algo.prompts_per_step=0", "algo.prompts_per_step"),
    ("algo=grpo algo.group_size=1", "algo.group_size"),
    ("sft.batch_size=0", "sft.batch_size"),
    ("reference=ema reference.alpha=1.5", "reference.alpha"),
    ("algo=grpo algo.loss_agg=mean", "algo.loss_agg"),
    ("algo=dpo algo.loss_type=ipo algo.label_smoothing=0.1", "algo.label_smoothing"),
    ("model.dim=100 model.n_heads=3", "model.dim"),
])
def test_bad_values_name_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        to_object(_compose(*override.split()))


def test_wrong_type_fails_at_compose():
    with pytest.raises(ConfigCompositionException, match="group_size"):
        _compose("algo=grpo", "algo.group_size=abc")
    with pytest.raises(ConfigCompositionException, match="local_batch|batch_size"):
        _compose("sft.batch_size=2.5")


def test_unknown_group_option_lists_the_valid_ones():
    with pytest.raises(MissingConfigException) as e:
        _compose("reference=bogus")
    assert "periodic_reset" in str(e.value)


def test_reference_free_dpo_needs_a_reference_free_loss():
    with pytest.raises(ConfigError, match="reference=none needs a reference-free loss"):
        to_object(_compose("algo=dpo", "reference=none"))
    to_object(_compose("algo=dpo", "reference=none", "algo.loss_type=simpo"))


def test_tensor_parallel_degree_must_divide_heads():
    cfg = _compose("parallelism=tp", "model.n_heads=3", "model.n_kv_heads=3", "model.dim=96")
    with pytest.raises(ConfigError, match="tensor_parallel_degree"):
        validate(cfg)


def test_missing_checkpoint_directory_is_named(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError, match="reference.checkpoint"):
        validate(_compose("algo=grpo", f"reference.checkpoint={missing}"))
    with pytest.raises(ConfigError, match="sft.checkpoint|initial_load_path"):
        validate(_compose("algo=grpo", f"checkpoint.initial_load_path={missing}"))


def test_gsm8k_needs_a_local_file():
    with pytest.raises(ConfigError, match="task.train_path"):
        to_object(_compose("task=gsm8k", "task.train_path=null"))
