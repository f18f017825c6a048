"""Every shipped config composes and validates, and every default has one home: the dataclasses.

In the style of lightning-hydra-template's tests/test_configs.py: compose each option of each group,
each experiment and each job of its sweep with Hydra's compose API, then ``to_object`` (every check).
On top of that, the one-home rule for defaults (refexp/config/__init__.py):

- an option file never restates a schema default (the same value in two places drifts apart);
- the option conf/config.yaml selects for a group, and every option of a group with one schema per
  option (algo/, reference/), sets nothing but ``name``: its values *are* the schema's defaults;
- schemas are stored outside every config group, so ``refexp --help`` lists only real options.
"""

from __future__ import annotations

import functools
import itertools
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from refexp.config import GROUP_SCHEMAS, OPTION_SCHEMAS, schema_name, to_object
from tests.helpers.configs import CONF_DIR, compose_root, conf_options, hydra_initialized

GROUPS = [*GROUP_SCHEMAS, *OPTION_SCHEMAS]
# Options that need a value no default can give (a local checkpoint or data file). The checkpoint is a
# directory that exists (to_object checks that much); data paths are read only by a run.
SOME_DIR = str(CONF_DIR)
REQUIRED = {
    ("model", "qwen3_0.6b"): [f"model.hf_assets_path={SOME_DIR}"],
    ("model", "llama3_8b"): [f"model.hf_assets_path={SOME_DIR}"],
    # Starts from its pretrained weights (sft.enable=false), which algo=sft (the root default) refuses.
    ("model", "smollm2_135m"): ["algo=grpo"],
    ("task", "gsm8k"): ["task.train_path=/x.jsonl", "task.tokenizer_path=/tok"],
    ("task", "reasoning_gym"): ["task.dataset=basic_arithmetic", "task.tokenizer_path=/tok"],
    # Pairs only: DPO from a pretrained checkpoint (the SFT stage would need demonstrations).
    ("task", "preference"): ["task.preference_path=/x.jsonl", "task.tokenizer_path=/tok", "algo=dpo",
                             "sft.enable=false", f"model.hf_assets_path={SOME_DIR}"],
}
# Groups whose schema defaults are deliberately no option: ModelConfig's None fields keep the torchtitan
# flavor's values (every option picks a model), and ParallelismConfig's data_parallel_shard_degree=-1 is
# torchtitan's "the rest of the world" (parallelism/single.yaml pins 1 for one process).
NO_DEFAULT_OPTION = {"model", "parallelism"}


def _yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def _selected() -> dict[str, str]:
    """group -> the option conf/config.yaml's defaults list selects."""
    out = {}
    for entry in _yaml(CONF_DIR / "config.yaml")["defaults"]:
        if isinstance(entry, dict):
            (group, option), = entry.items()
            out[group] = option
    return out


def _is_global(path: Path) -> bool:
    """An option file that also sets other blocks (``# @package _global_``: its group's values under the group's
    key, e.g. model/smollm2_135m.yaml's ``sft.enable``)."""
    return path.read_text().startswith("# @package _global_")


def _own_values(path: Path) -> dict:
    """What an option file sets in its own group (a ``_global_`` file: under the group's key)."""
    values = _yaml(path)
    return values.get(path.parent.name, {}) if _is_global(path) else values


def _schema_of(path: Path) -> tuple[str, dict]:
    """The schema an option file names first in its defaults list, and that schema's defaults."""
    first = _yaml(path)["defaults"][0]
    at = f"@{path.parent.name}" if _is_global(path) else "@_here_"
    assert isinstance(first, str) and first.startswith("/") and first.endswith(f"_schema{at}"), (
        f"{path}: expected its defaults list to start with /<schema>{at}, got {first!r}")
    name = first[1:-len(at)]
    node = ConfigStore.instance().load(f"{name}.yaml").node
    return name, OmegaConf.to_container(node, resolve=False)


REPLICATE_KEYS = ("training.seed", "sft.seed")
"""Swept keys that change no check: one value of each is composed."""


def _launcher_grids(experiment: str) -> list[dict[str, str]]:
    """The per-arm grids ``launch/<experiment>.sh`` runs (its ``grid ARM key=a,b ...`` lines), as overrides with
    the experiment's arm key; [] without such a script."""
    path = CONF_DIR.parent / "launch" / f"{experiment}.sh"
    if not path.exists():
        return []
    arm_key = _yaml(CONF_DIR / "experiment" / f"{experiment}.yaml")["comparison"]["arm_key"]
    grids = []
    for line in path.read_text().splitlines():
        words = line.split()
        if words[:1] == ["grid"] and len(words) > 1:
            grids.append({arm_key: words[1], **dict(w.split("=", 1) for w in words[2:])})
    return grids


def _sweep_jobs(experiment: str) -> list[list[str]]:
    """The overrides of every job of an experiment's sweep (``hydra.sweeper.params``, choice sweeps; each grid of
    its launcher script), one value of each replicate key."""
    params = (_yaml(CONF_DIR / "experiment" / f"{experiment}.yaml").get("hydra", {}).get("sweeper", {})
              .get("params", {}))
    jobs = []
    for grid in _launcher_grids(experiment) or [{}]:
        swept = {**params, **grid}
        keys = list(swept)
        values = [str(swept[k]).split(",")[:1 if k in REPLICATE_KEYS else None] for k in keys]
        jobs += [[f"{k}={v}" for k, v in zip(keys, combo)] for combo in itertools.product(*values)]
    return jobs or [[]]


OPTION_FILES = [(g, o) for g in GROUPS for o in conf_options(g)]
EXPERIMENT_JOBS = [(e, job) for e in conf_options("experiment") for job in _sweep_jobs(e)]


# ---------------------------------------------------------------- everything composes and validates
@pytest.mark.parametrize("experiment", conf_options("experiment"))
def test_every_experiment_composes(experiment):
    cfg = compose_root(f"experiment={experiment}")
    assert cfg.experiment_name == experiment
    to_object(cfg)


@pytest.mark.parametrize("group, option", OPTION_FILES, ids=[f"{g}={o}" for g, o in OPTION_FILES])
def test_every_option_composes_and_validates(group, option):
    cfg = to_object(compose_root(f"{group}={option}", *REQUIRED.get((group, option), [])))
    assert getattr(cfg, group) is not None


@pytest.mark.parametrize("experiment, job", EXPERIMENT_JOBS,
                         ids=[f"{e}:{','.join(j) or 'single'}" for e, j in EXPERIMENT_JOBS])
def test_every_experiment_job_composes_and_validates(experiment, job):
    """Each job of each sweep, as Hydra's basic sweeper would compose it (a strategy's own fields must
    not be set for the other strategies of a sweep)."""
    cfg = _job_config(experiment, tuple(job))
    assert cfg.experiment_name == experiment


@functools.lru_cache(maxsize=None)
def _job_config(experiment: str, job: tuple[str, ...]):
    """One sweep job's validated config, composed once for the tests that read it (no test changes it)."""
    return to_object(compose_root(f"experiment={experiment}", *job))


# ---------------------------------------------------------------- one home for every default
def test_every_committed_comparison_has_its_baseline_and_the_headroom_task():
    """What a strategy adds over more SFT is its difference from continued SFT (GRPO) or NLL on the chosen
    side (DPO): every comparison sweeps that baseline, on the task where more SFT cannot reach the reward. A sweep
    that optimises a learned reward asks another question (gold against proxy, each arm against none), and one
    that compares the KL strategies at matched drift across beta (``comparison.frontier_key``) asks which
    reference buys more at equal drift: they keep the headroom task but not the more-SFT arm. One that starts every
    job from a pretrained checkpoint with no SFT stage (``sft.enable=false``: ``smollm2_grpo``) has no SFT
    demonstrator to do more of: it asks whether what the embedded task found holds on a real model's own start."""
    for experiment in conf_options("experiment"):
        jobs = [_job_config(experiment, tuple(job)) for job in _sweep_jobs(experiment)]
        if not any(cfg.sft.enable for cfg in jobs):  # the config refuses sft.enable=false without a checkpoint
            continue
        algos = {cfg.algo.name for cfg in jobs}
        assert all(cfg.task.demo_slip > 0.5 for cfg in jobs), experiment
        if "grpo" in algos and not any(cfg.task.reward_model or cfg.comparison.frontier_key for cfg in jobs):
            assert any(cfg.algo.objective == "continued_sft" and cfg.reference.name == "none"
                       for cfg in jobs), experiment
        if "dpo" in algos:
            assert any(cfg.algo.loss_type == "sft" for cfg in jobs), experiment


@pytest.mark.parametrize("group, option", OPTION_FILES, ids=[f"{g}={o}" for g, o in OPTION_FILES])
def test_option_files_restate_no_schema_default(group, option):
    path = CONF_DIR / group / f"{option}.yaml"
    name, defaults = _schema_of(path)
    values = {k: v for k, v in _own_values(path).items() if k not in ("defaults", "name")}
    unknown = sorted(set(values) - set(defaults))
    assert not unknown, f"{path}: {unknown} are not fields of {name}"
    same = {k: v for k, v in values.items() if v == defaults[k]}
    assert not same, f"{path} restates {name}'s defaults {same}: drop them (the dataclass is their one home)"


@pytest.mark.parametrize("group", [g for g in GROUPS if g not in NO_DEFAULT_OPTION])
def test_default_options_are_their_schema(group):
    """The option whose values are the schema's defaults sets nothing but ``name`` (a value that differs
    belongs in the dataclass): every option of algo/ and reference/, else the one conf/config.yaml selects."""
    options = conf_options(group) if group in OPTION_SCHEMAS else [_selected()[group]]
    for option in options:
        path = CONF_DIR / group / f"{option}.yaml"
        name, defaults = _schema_of(path)
        if group in OPTION_SCHEMAS:
            assert name == schema_name(group, option), f"{path} must start from /{schema_name(group, option)}"
        assert _yaml(path).get("name", defaults.get("name")) == defaults.get("name"), path
        differs = {k: v for k, v in _yaml(path).items() if k not in ("defaults", "name")}
        assert not differs, (f"{path} is {name}'s default option but sets {differs}: make them the dataclass "
                             f"defaults instead")


def test_the_root_config_restates_no_default():
    defaults = OmegaConf.to_container(ConfigStore.instance().load("root_schema.yaml").node, resolve=False)
    values = {k: v for k, v in _yaml(CONF_DIR / "config.yaml").items() if k not in ("defaults", "hydra")}
    assert not {k: v for k, v in values.items() if v == defaults.get(k)}, values


# ---------------------------------------------------------------- schemas are not options
def test_schemas_are_not_group_options():
    with hydra_initialized():
        loader = GlobalHydra.instance().config_loader()
        groups = [g for g in loader.list_groups("") if g != "hydra"]
        listed = {g: loader.get_group_options(g) for g in groups}
    assert set(GROUPS) <= set(groups)
    assert not [g for g in groups if "schema" in g], groups
    assert not {g: o for g, opts in listed.items() for o in opts if "schema" in o}, listed


def test_help_lists_no_schema():
    out = subprocess.run([sys.executable, "-m", "refexp", "--help"], capture_output=True, text=True, timeout=120,
                         cwd=CONF_DIR.parent, check=True).stdout
    for group in ("algo", "reference", "model"):  # each group's options, as conf/ has them, and nothing else
        assert f"{group}: {', '.join(conf_options(group))}\n" in out
    assert "_schema" not in out
