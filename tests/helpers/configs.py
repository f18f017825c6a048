"""Composing refexp's config as tests need it: the root config, and the override lists of the tiny runs
(the whole pipeline on CPU in seconds; docs/architecture.md, "Tests")."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from hydra import compose, initialize_config_dir

from refexp.config import register_configs

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
HYDRA_VERSION_BASE = "1.3"
register_configs()

# A 2-layer dim-32 llama3, a 30-step SFT (cached for the whole session), a small task.
TINY_RUN_OVERRIDES = [
    "model=tiny", "model.dim=32", "model.ffn_hidden_dim=64", "model.n_heads=2", "model.n_kv_heads=2",
    "sft.steps=30", "sft.target_accuracy=1.0", "sft.eval_every=30", "sft.batch_size=32",
    "task.num_train=2000", "task.num_eval=64",
    "eval.num_prompts=16", "eval.kl_prompts=8", "eval.every=2",
    "logger=none", "logger.progress=false", "training.num_threads=1",
]
# GRPO on top of TINY_RUN_OVERRIDES: 4 prompts x 4 completions for 4 steps.
TINY_GRPO_OVERRIDES = ["algo=grpo", "algo.prompts_per_step=4", "algo.group_size=4", "training.steps=4",
                       "training.lr=1e-3"]

# The runs that multi-process and resumed runs are compared with: the embedded arithmetic with 1-digit
# operands and a 120-step SFT model that gets about a third right, so GRPO's rewards, advantages and
# updates are non-trivial in a 4-step run.
SMALL_RUN_OVERRIDES = [
    "model=tiny", "model.dim=32", "model.ffn_hidden_dim=64", "model.n_heads=2", "model.n_kv_heads=2",
    "task.digits=1", "task.num_train=80", "task.num_eval=16",
    "sft.steps=120", "sft.target_accuracy=1.0", "sft.eval_every=40", "sft.batch_size=32",
    "eval.num_prompts=16", "eval.kl_prompts=8", "eval.every=2",
    "logger=none", "logger.progress=false", "training.num_threads=1", "training.steps=4", "training.lr=1e-3",
]
# The algorithms on top of SMALL_RUN_OVERRIDES: 4 prompts x 4 completions, or 8 of 32 pairs a step.
SMALL_GRPO_OVERRIDES = ["algo=grpo", "algo.prompts_per_step=4", "algo.group_size=4"]
SMALL_DPO_OVERRIDES = ["algo=dpo", "algo.num_pairs=32", "algo.pairs_per_step=8"]


@contextmanager
def hydra_initialized():
    """Hydra initialised on conf/ as ``refexp`` initialises it."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=HYDRA_VERSION_BASE):
        yield


def compose_config(*overrides: str, return_hydra_config: bool = False):
    """conf/config.yaml composed with ``overrides`` (Hydra's compose API)."""
    with hydra_initialized():
        return compose("config", overrides=list(overrides), return_hydra_config=return_hydra_config)


def compose_root(*overrides: str):
    """The root config as ``refexp`` composes it (no test presets), with a placeholder run dir."""
    return compose_config("run_dir=/tmp/refexp-unused", *overrides)


def compose_tiny_run(run_dir, *overrides: str):
    """A tiny run (TINY_RUN_OVERRIDES) in ``run_dir``; ``overrides`` come last and win."""
    return compose_config(*TINY_RUN_OVERRIDES, f"run_dir={run_dir}", *overrides)


def compose_small_run(run_dir, *overrides: str):
    """A small run (SMALL_RUN_OVERRIDES) in ``run_dir``; ``overrides`` come last and win."""
    return compose_config(*SMALL_RUN_OVERRIDES, f"run_dir={run_dir}", *overrides)


def conf_options(group: str) -> list[str]:
    """The option names of a config group (its YAML files under conf/)."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
