"""refexp as a native Hydra app: its own name and help, no empty log files, dpo_variant and debug as
ordinary groups."""

from __future__ import annotations

import subprocess
import sys

import pytest

from refexp.config import to_object
from refexp.record.status import read_status
from tests.helpers.configs import TINY_GRPO_OVERRIDES, TINY_RUN_OVERRIDES, compose_root, conf_options


def test_help_names_the_app_and_lists_groups_and_fields():
    out = subprocess.run([sys.executable, "-m", "refexp", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    assert out.stdout.startswith("refexp: ") and "powered by Hydra" not in out.stdout
    assert f"dpo_variant: {', '.join(conf_options('dpo_variant'))}\n" in out.stdout
    assert "training.micro_batch_size" in out.stdout and "--cfg job" in out.stdout


def test_dpo_variant_is_an_ordinary_group_that_selects_dpo():
    cfg = to_object(compose_root("dpo_variant=orpo"))  # no `+`, no algo=dpo
    assert (cfg.algo.name, cfg.algo.loss_type, cfg.reference.name) == ("dpo", "orpo", "none")
    cfg = to_object(compose_root("dpo_variant=periodic_reset"))
    assert (cfg.algo.name, cfg.reference.name, cfg.reference.reset_every) == ("dpo", "periodic_reset", 50)


def test_debug_fast_shortens_everything_and_turns_off_outputs():
    cfg = to_object(compose_root("algo=grpo", "debug=fast"))
    assert cfg.training.steps == 3 and cfg.eval.every == 1 and cfg.sft.steps == 20
    assert cfg.logger.name == "none" and not cfg.checkpoint.enable


@pytest.mark.slow
def test_a_single_run_ends_with_a_summary_line_and_leaves_no_empty_log_file(tmp_path):
    run_dir = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "refexp", *TINY_RUN_OVERRIDES, *TINY_GRPO_OVERRIDES, "training.steps=1",
                          f"hydra.run.dir={run_dir}"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert not list(run_dir.glob("*.log")), list(run_dir.iterdir())
    assert (run_dir / "metrics.jsonl").is_file()
    (last,) = [ln for ln in out.stdout.splitlines() if ln.startswith("[refexp] done:")]
    assert "eval/accuracy" in last and "kl/init" in last and "1 steps" in last and str(run_dir) in last


@pytest.mark.slow
def test_an_optuna_search_completes_and_reports_the_best_trial(tmp_path):
    import yaml

    sweep = tmp_path / "search"
    out = subprocess.run([sys.executable, "-m", "refexp", "-m", "hparams_search=grpo_reset", *TINY_RUN_OVERRIDES,
                          *TINY_GRPO_OVERRIDES[1:], "hydra.sweeper.n_trials=4", "training.steps=5",
                          f"hydra.sweep.dir={sweep}"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert set(best["best_params"]) == {"reference.reset_every", "algo.beta"}
    values = [final_val_accuracy(d) for d in sorted(sweep.iterdir()) if (d / "status.json").is_file()]
    assert len(values) == 4 and best["best_value"] == max(values)


def final_val_accuracy(run_dir):
    return read_status(run_dir)["final"]["val/accuracy"]


@pytest.mark.parametrize("overrides", [
    ["-m", "hparams_search=grpo_reset", "task.val_fraction=0"],
    ["hparams_search=grpo_reset", "task.val_fraction=0"],  # hparams_search sets hydra.mode=MULTIRUN itself
    ["-m", "hparams_search=grpo_reset", "task.val_fraction=0", "algo.beta=0.1,0.2"],  # a swept key elsewhere
])
def test_a_search_without_a_validation_split_is_refused_before_its_first_trial(tmp_path, overrides):
    """A search selects on validation accuracy and never on test: no validation split, no trial."""
    import time

    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "refexp", *overrides, "logger=none",
                          f"hydra.sweep.dir={tmp_path / 'search'}"], capture_output=True, text=True, timeout=120)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("refexp: error: task.val_fraction=0.0"), out.stderr
    assert "task.val_path" in lines[0] and "validation split" in lines[0]
    assert not (tmp_path / "search").exists()  # no trial ran
    assert time.monotonic() - t0 < 10


def test_search_value_is_validation_accuracy_and_never_test_accuracy():
    from refexp.run import search_value

    assert search_value({"val/accuracy": 0.5, "eval/accuracy": 0.9}) == 0.5
    assert search_value({"eval/accuracy": 0.9}) is None
    assert search_value(None) is None


@pytest.mark.parametrize("overrides, has_validation", [
    ([], True),  # the embedded task carves off DEFAULT_VAL_FRACTION
    (["task.val_fraction=0"], False),
    (["task=gsm8k", "task.train_path=train.jsonl"], False),  # a data file: none unless asked for
    (["task=gsm8k", "task.train_path=train.jsonl", "task.val_path=val.jsonl"], True),
    (["task=gsm8k", "task.train_path=train.jsonl", "task.val_fraction=0.1"], True),
    (["algo=dpo", "task=preference", "task.preference_path=pairs.jsonl", "sft.enable=false"], False),
])
def test_only_a_search_needs_a_validation_split(overrides, has_validation):
    from omegaconf import OmegaConf

    from refexp.config import ConfigError, check_search_validation
    from refexp.config.search import BASIC_SWEEPER

    task = OmegaConf.to_object(compose_root(*overrides).task)
    assert task.has_validation() == has_validation
    check_search_validation(BASIC_SWEEPER, task)  # a grid sweep ignores the jobs' return values
    optuna = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    if has_validation:
        check_search_validation(optuna, task)
    else:
        with pytest.raises(ConfigError, match="validation split"):
            check_search_validation(optuna, task)
