"""Bad config input fails with a message naming the field, before any model is built (the shipped configs
compose: test_shipped_configs.py)."""

from __future__ import annotations

import re

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException

from refexp.config import ConfigError, to_object
from refexp.run import validate
from tests.helpers.configs import compose_root, conf_options


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
        to_object(compose_root(*override.split()))


def test_wrong_type_fails_atcompose_root():
    with pytest.raises(ConfigCompositionException, match="group_size"):
        compose_root("algo=grpo", "algo.group_size=abc")
    with pytest.raises(ConfigCompositionException, match="local_batch|batch_size"):
        compose_root("sft.batch_size=2.5")


@pytest.mark.parametrize("choice, key, schema, fields", [
    ("reference=fixed", "reference.reset_every", "FixedReferenceConfig", "name, checkpoint, dtype, compile, offload"),
    ("reference=ema", "reference.reset_optimizer", "EMAReferenceConfig",
     "name, checkpoint, dtype, compile, offload, sync_every, alpha"),
    ("reference=none", "reference.alpha", "NoReferenceConfig", "name, checkpoint, dtype, compile, offload"),
    ("algo=dpo", "algo.group_size", "DPOConfig", "name, loss_type, beta"),
    ("algo=grpo", "algo.precompute_ref", "GRPOConfig", "name, prompts_per_step, group_size"),
])
def test_a_field_of_another_option_is_rejected_naming_it(choice, key, schema, fields):
    """Each strategy / algorithm has only its own fields: setting another's fails at compose (Hydra names
    the key and the schema), and adding it with + fails at validation (refexp names the option's fields)."""
    with pytest.raises(ConfigCompositionException) as e:
        compose_root(choice, f"{key}=1")
    cause = str(e.value.__cause__)
    assert f"full_key: {key}" in cause and schema in cause
    group, option = choice.split("=")
    with pytest.raises(ConfigError, match=re.escape(f"{key} is not a field of {group}={option} (its fields: {fields}")):
        to_object(compose_root(choice, f"+{key}=1"))


def test_removed_fields_are_rejected():
    for key in ("logger.log_every", "checkpoint.initial_load_model_only", "algo.loss_type"):
        with pytest.raises(ConfigCompositionException):
            compose_root("algo=grpo", f"{key}=1")


def test_the_strategy_is_chosen_by_the_group_not_the_name():
    with pytest.raises(ConfigError, match=r"reference\.name='fixed' is invalid: expected 'ema' for reference=ema"):
        to_object(compose_root("reference=ema", "reference.name=fixed"))


def test_unknown_group_option_lists_the_valid_ones():
    with pytest.raises(MissingConfigException) as e:
        compose_root("reference=bogus")
    assert "periodic_reset" in str(e.value)


def test_reference_free_dpo_needs_a_reference_free_loss():
    with pytest.raises(ConfigError, match="reference=none needs a reference-free loss"):
        to_object(compose_root("algo=dpo", "reference=none"))
    to_object(compose_root("algo=dpo", "reference=none", "algo.loss_type=simpo"))


def test_tensor_parallel_degree_must_divide_heads():
    cfg = compose_root("parallelism=tp", "model.n_heads=3", "model.n_kv_heads=3", "model.dim=96")
    with pytest.raises(ConfigError, match="tensor_parallel_degree"):
        validate(cfg)


@pytest.mark.parametrize("field", ["reference.checkpoint", "checkpoint.initial_load_path", "sft.checkpoint",
                                   "model.hf_assets_path"])
def test_missing_checkpoint_directory_is_named_by_the_config_layer_but_not_in_a_dry_run(tmp_path, field):
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError, match=re.escape(f"{field}={str(missing)!r} is not a directory")):
        to_object(compose_root("algo=grpo", f"{field}={missing}"))
    to_object(compose_root("algo=grpo", f"{field}={missing}", "dry_run=true"))  # a plan reads no weights


def test_every_table_keyed_by_strategy_names_exactly_the_reference_strategies():
    from refexp.choices import MOVING_STRATEGIES, REFERENCE_STRATEGIES
    from refexp.config import REFERENCE_SCHEMAS
    from refexp.reference.strategies import REGISTRY
    from refexp.report.reading.group import DPO_REFERENCE_NAMES
    from refexp.report.writing.plots import STRATEGY_COLOURS

    assert tuple(REFERENCE_SCHEMAS) == REFERENCE_STRATEGIES == tuple(REGISTRY)
    assert set(DPO_REFERENCE_NAMES) == set(STRATEGY_COLOURS) == set(REFERENCE_STRATEGIES)
    assert set(MOVING_STRATEGIES) < set(REFERENCE_STRATEGIES)
    assert conf_options("reference") == sorted(REFERENCE_STRATEGIES)


def test_static_decode_needs_plain_weights():
    """rollout.static_decode decodes with the fixed-shape step over plain weights; TP's are DTensors."""
    to_object(compose_root("rollout.static_decode=true"))
    with pytest.raises(ConfigError, match="rollout.static_decode=true .* parallelism.tensor_parallel_degree=2"):
        to_object(compose_root("rollout.static_decode=true", "parallelism=tp", "parallelism.tensor_parallel_degree=2"))


def test_gsm8k_needs_a_local_file():
    with pytest.raises(ConfigError, match="task.train_path"):
        to_object(compose_root("task=gsm8k", "task.train_path=null"))


@pytest.mark.parametrize("overrides, prefix", [
    (["training.steps=-1"], "training.steps=-1 is invalid"),
    (["algo=grpo", "algo.group_size=1"], "algo.group_size=1 is invalid"),
    (["model=llama3_7b"], "model=llama3_7b is not an option of model/: expected one of llama3_8b, llama3_debug"),
    (["reference=frozen"], "reference=frozen is not an option of reference/: expected one of ema, fixed"),
    (["parallelism=tp", "parallelism.tensor_parallel_degree=3"],
     "parallelism.tensor_parallel_degree=3 is invalid: it must divide model.n_heads=8"),
    (["parallelism=fsdp", "parallelism.nproc_per_node=3", "parallelism.tensor_parallel_degree=2",
      "model.n_heads=2", "model.n_kv_heads=2"],
     "parallelism.data_parallel_replicate_degree=1 x parallelism.tensor_parallel_degree=2 = 2 is invalid: "
     "it must divide the world size 3"),
    (["training.stepz=3"], "training.stepz is not a field of TrainingConfig"),
    (["algo=grpo", "algo.beta=abc"], "algo.beta='abc' is invalid: expected a float"),
    (["algo=grpo", "training.lr=-1", "--cfg", "job"], "training.lr=-1.0 is invalid"),  # --cfg job validates too
])
def test_cli_config_error_is_one_line_exit_2_without_traceback(tmp_path, overrides, prefix):
    """Like a CLI (argparse): the message alone on stderr, exit status 2, found before torch is imported."""
    import subprocess
    import sys
    import time

    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "refexp", *overrides, "logger=none", f"hydra.run.dir={tmp_path}"],
                         capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - t0
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2, out.stderr
    assert len(lines) == 1 and lines[0].startswith(f"refexp: error: {prefix}"), out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    assert elapsed < 10, elapsed
