"""Tiny end-to-end configs: the whole pipeline on CPU in seconds (docs/architecture.md, "Tests")."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir

from refexp.config import register_configs

CONF = Path(__file__).resolve().parents[1] / "conf"
register_configs()

# A 2-layer dim-32 llama3, a 30-step SFT (cached for the whole session), a small task.
TINY = [
    "model=tiny", "model.dim=32", "model.ffn_hidden_dim=64", "model.n_heads=2", "model.n_kv_heads=2",
    "sft.steps=30", "sft.target_accuracy=1.0", "sft.eval_every=30", "sft.batch_size=32",
    "task.num_train=2000", "task.num_eval=64",
    "eval.num_prompts=16", "eval.kl_prompts=8", "eval.every=2",
    "logger=none", "logger.progress=false", "training.num_threads=1",
]
GRPO = ["algo=grpo", "algo.prompts_per_step=4", "algo.group_size=4", "training.steps=4", "training.lr=1e-3"]


def compose_root(*overrides: str):
    """The root config as ``refexp`` composes it (no test presets), with a placeholder run dir."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=["run_dir=/tmp/refexp-unused", *overrides])


def conf_options(group: str) -> list[str]:
    """The option names of a config group (its YAML files under conf/)."""
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def compose_cfg(run_dir, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=[*TINY, f"run_dir={run_dir}", *overrides])
