"""The whole run (``RootConfig``), the registration of every schema, and ``to_object``.

Schemas are stored in Hydra's ConfigStore as top-level configs (``/<group>_schema``, or
``/<group>_<option>_schema`` for groups with one schema per option), never inside a config group: Hydra
lists every entry of a group as an option in ``refexp --help`` and tab completion, and a schema is not
one. Each option file starts with ``defaults: [/<its schema>@_here_, _self_]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from refexp.choices import DPO_REFERENCE_FREE_LOSSES, REFERENCE_STRATEGIES, renamed_field_hint

from .algo import ALGO_SCHEMAS, AlgoConfig, DPOConfig
from .blocks import EvalConfig, RMStageConfig, SFTConfig
from .comparison import ComparisonConfig
from .errors import ConfigError, check_finite_floats
from .logger import LoggerConfig
from .model import CompileConfig, ModelConfig, ParallelismConfig, check_attention_heads
from .reference import REFERENCE_SCHEMAS, ReferenceConfig
from .rollout import RolloutConfig
from .runtime import ActivationCheckpointConfig, CheckpointConfig, CommConfig, TrainingConfig
from .task import TaskConfig


@dataclass
class RootConfig:
    """The whole run. Groups are chosen in conf/config.yaml's defaults list."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """``model=<option>``: the torchtitan model."""
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    """``parallelism=<option>``: FSDP / TP / HSDP degrees and worker processes."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """``checkpoint=<option>``: saving and resuming."""
    compile: CompileConfig = field(default_factory=CompileConfig)
    """``compile=<option>``: per-block torch.compile."""
    comm: CommConfig = field(default_factory=CommConfig)
    """``comm=<option>``: process-group backend and timeouts."""
    training: TrainingConfig = field(default_factory=TrainingConfig)
    """``training=<option>``: optimisation of the RL stage."""
    activation_checkpoint: ActivationCheckpointConfig = field(default_factory=ActivationCheckpointConfig)
    """``activation_checkpoint=<option>``: none | selective | full."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """``task=<option>``: prompts, answers, reward."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """``rollout=<option>``: the engine that generates completions."""
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    """``logger=<option>``: W&B and metrics.jsonl."""
    algo: Any = MISSING
    """``algo=<option>``: one of the ``ALGO_SCHEMAS`` (typed Any: each option has its own schema)."""
    reference: ReferenceConfig = field(default_factory=ReferenceConfig)
    """``reference=<option>``: one of the ``REFERENCE_SCHEMAS`` (the base here only until one is chosen)."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out measurements (set in place: ``eval.every=25``)."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """The SFT stage (set in place: ``sft.steps=500``)."""
    rm: RMStageConfig = field(default_factory=RMStageConfig)
    """The reward-model stage of ``algo=rm`` and ``task.reward_model=rm`` (set in place: ``rm.num_samples=512``)."""
    comparison: ComparisonConfig = field(default_factory=ComparisonConfig)
    """The comparison an experiment was planned for (set in ``conf/experiment/*.yaml``; read by the report)."""
    experiment_name: str = "default"
    """Names the comparison (W&B group prefix, report title)."""
    dry_run: bool = False
    """Print the per-rank memory plan of the configured run (models on the meta device: no checkpoint,
    no data) and exit (refexp/cli/dry_run.py)."""
    run_dir: Optional[str] = None
    """Where this run's files go (metrics.jsonl, status.json, checkpoint/); None = Hydra's output dir
    (set it with hydra.run.dir=DIR)."""


GROUP_SCHEMAS: dict[str, type] = {
    "model": ModelConfig,
    "parallelism": ParallelismConfig,
    "checkpoint": CheckpointConfig,
    "compile": CompileConfig,
    "comm": CommConfig,
    "training": TrainingConfig,
    "activation_checkpoint": ActivationCheckpointConfig,
    "task": TaskConfig,
    "rollout": RolloutConfig,
    "logger": LoggerConfig,
}
"""Groups whose options share one schema, stored as ``/<group>_schema``."""
OPTION_SCHEMAS: dict[str, dict[str, type]] = {"algo": ALGO_SCHEMAS, "reference": REFERENCE_SCHEMAS}
"""Groups with one schema per option, stored as ``/<group>_<option>_schema``."""


def schema_name(group: str, option: str | None = None) -> str:
    """The ConfigStore name an option file of ``group`` names in its defaults list."""
    return f"{group}_{option}_schema" if option is not None else f"{group}_schema"


def register_configs() -> None:
    """Store ``root_schema`` and every group's schema(s) as top-level configs (see the module docstring)."""
    cs = ConfigStore.instance()
    cs.store(name="root_schema", node=RootConfig)
    for group, schema in GROUP_SCHEMAS.items():
        cs.store(name=schema_name(group), node=schema)
    for group, schemas in OPTION_SCHEMAS.items():
        for option, schema in schemas.items():
            cs.store(name=schema_name(group, option), node=schema)
    if not OmegaConf.has_resolver("refexp_gpu_count"):  # conf/hydra/launcher/local_gpus.yaml's n_jobs
        OmegaConf.register_new_resolver("refexp_gpu_count", _gpu_count)
    if not OmegaConf.has_resolver("refexp_side_by_side_jobs"):  # conf/hydra/launcher/cpu_cores.yaml's n_jobs
        OmegaConf.register_new_resolver("refexp_side_by_side_jobs", _side_by_side_jobs)


def _gpu_count() -> int:
    """Visible CUDA devices, at least 1 (torch is imported only when a config asks)."""
    import torch

    return max(1, torch.cuda.device_count())


def _side_by_side_jobs() -> int:
    """One job per visible CUDA device, else one per CPU core this process may use."""
    import os

    import torch

    return torch.cuda.device_count() or len(os.sched_getaffinity(0))


def to_object(cfg: DictConfig) -> RootConfig:
    """Resolve a composed DictConfig into dataclasses, running every ``__post_init__`` check, the finite-float
    check (``check_finite_floats``), the cross-field checks and (unless ``dry_run``) ``check_start_weights``.

    Raises ConfigError naming the field (OmegaConf's own type errors are re-raised as ConfigError too).
    """
    from omegaconf.errors import OmegaConfBaseException

    check_known_fields(cfg)
    try:
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:  # type errors: "Value 'x' of type str could not be converted to int"
        raise ConfigError(str(e).strip()) from e
    except ConfigError:
        raise
    except Exception as e:  # a __post_init__ raising through OmegaConf is wrapped: unwrap it
        cause = e
        while cause is not None and not isinstance(cause, ConfigError):
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            raise cause from None
        raise
    if not isinstance(obj.algo, AlgoConfig):
        raise ConfigError(f"algo={obj.algo!r} is invalid: expected one of {', '.join(ALGO_SCHEMAS)}")
    if type(obj.reference) not in REFERENCE_SCHEMAS.values():
        raise ConfigError(f"reference is not chosen: expected reference=<one of {', '.join(REFERENCE_SCHEMAS)}>")
    check_finite_floats(obj)
    check_cross_fields(obj)
    if not obj.dry_run:
        check_start_weights(obj)
    return obj


def check_known_fields(cfg: DictConfig, path: str = "") -> None:
    """Reject keys a schema does not have. ``group.key=v`` on a missing key already fails at compose
    (Hydra: "Key 'key' not in '<Schema>'"), but ``+group.key=v`` adds it and ``OmegaConf.to_object``
    would then drop it without a word."""
    schema = OmegaConf.get_type(cfg)
    if not (isinstance(schema, type) and is_dataclass(schema)):
        return
    known = [f.name for f in fields(schema)]
    for key in cfg.keys():
        if not path and key == "hydra":  # Hydra's own node, present when composed with return_hydra_config
            continue
        full = f"{path}.{key}" if path else str(key)
        if key not in known:
            raise ConfigError(f"{full} is not a field of {_describe(path, schema)}{renamed_field_hint(full)} "
                              f"(its fields: {', '.join(known)})")
        if OmegaConf.is_missing(cfg, key) or OmegaConf.is_interpolation(cfg, key):
            continue
        child = cfg[key]
        if isinstance(child, DictConfig):
            check_known_fields(child, full)


def _describe(path: str, schema: type) -> str:
    """``reference=fixed`` for a group with one schema per option, else the group's path."""
    if not path:
        return "the root config"
    for option, option_schema in OPTION_SCHEMAS.get(path, {}).items():
        if option_schema is schema:
            return f"{path}={option}"
    return path


def check_cross_fields(cfg: RootConfig) -> None:
    """Checks that need more than one group."""
    # First: with the wrong algorithm every other message about the pair would mislead.
    if cfg.task.name == "preference":
        if cfg.algo.name != "dpo":
            raise ConfigError(
                f"task=preference is invalid with algo={cfg.algo.name}: the preference task has pairs only, no "
                f"reward or verifier for GRPO and no demonstrations for SFT; expected algo=dpo (or another task)")
        if cfg.sft.enable and not cfg.sft.checkpoint:
            raise ConfigError("task=preference needs sft.enable=false (start from model.hf_assets_path) or "
                              "sft.checkpoint=DIR: the SFT stage needs demonstrations, which preference pairs are not")
    if cfg.task.learned_rewards() and cfg.algo.name != "grpo":
        field_name = next(f"task.{n}" for n in ("reward_model", "reward_funcs", "gold_reward_model")
                          if getattr(cfg.task, n))
        raise ConfigError(f"{field_name} is invalid with algo={cfg.algo.name}: only algo=grpo optimises or logs a "
                          f"learned reward (unset it, or use algo=grpo)")
    if cfg.algo.name == "rm" and cfg.parallelism.nproc_per_node > 1:
        raise ConfigError(f"parallelism.nproc_per_node={cfg.parallelism.nproc_per_node} is invalid with algo=rm: "
                          f"the reward-model stage trains in one process (expected 1)")
    if not cfg.sft.enable:
        if cfg.algo.name == "sft":
            raise ConfigError("sft.enable=false is invalid with algo=sft: the SFT stage is all that algo runs "
                              "(use algo=grpo or algo=dpo to start from model.hf_assets_path)")
    if cfg.sft.enable and not cfg.sft.checkpoint and cfg.sft.target_accuracy < 1.0 and not cfg.task.has_validation():
        raise ConfigError(f"sft.target_accuracy={cfg.sft.target_accuracy} needs a validation split to read (the "
                          f"test split never stops anything): set task.val_path or task.val_fraction, or leave "
                          f"sft.target_accuracy at 1.0")
    check_sequence_fits(cfg)
    check_attention_heads(n_heads=cfg.model.n_heads, n_kv_heads=cfg.model.n_kv_heads,
                          tensor_parallel_degree=cfg.parallelism.tensor_parallel_degree)
    if cfg.rollout.static_decode and cfg.parallelism.tensor_parallel_degree > 1:
        raise ConfigError("rollout.static_decode=true needs plain (unsharded) weights to decode with, and "
                          f"parallelism.tensor_parallel_degree={cfg.parallelism.tensor_parallel_degree} decodes "
                          "through the sharded sub-modules: set rollout.static_decode=false or the TP degree to 1")
    if getattr(cfg.algo, "objective", "grpo") == "continued_sft" and cfg.reference.name != "none":
        raise ConfigError(f"algo.objective=continued_sft (the continued-SFT baseline) is invalid with reference="
                          f"{cfg.reference.name}: it has no KL term; expected reference=none")
    if getattr(cfg.algo, "share_prompt", False) and cfg.model.attn_backend != "sdpa":
        raise ConfigError(f"algo.share_prompt=true needs model.attn_backend=sdpa (got {cfg.model.attn_backend!r}): "
                          f"set algo.share_prompt=false to use the {cfg.model.attn_backend} backend")
    mbs = cfg.training.micro_batch_size
    if (mbs is not None and cfg.algo.name == "grpo" and cfg.algo.share_prompt and cfg.algo.objective == "grpo"
            and mbs % cfg.algo.group_size):  # the continued-SFT baseline's rows are prompts, not groups
        raise ConfigError(
            f"training.micro_batch_size={mbs} is invalid with algo.share_prompt=true: a chunk must hold whole "
            f"prompt groups, expected a multiple of algo.group_size={cfg.algo.group_size} (or algo.share_prompt=false)")
    check_lora(cfg)
    if isinstance(cfg.algo, DPOConfig):
        if cfg.reference.name == "none" and not cfg.algo.reference_free:
            raise ConfigError(
                f"reference=none needs a reference-free loss: algo.loss_type={cfg.algo.loss_type!r} uses a "
                f"reference; use algo.loss_type=<one of {', '.join(DPO_REFERENCE_FREE_LOSSES)}>, or pick a "
                f"reference strategy ({', '.join(s for s in REFERENCE_STRATEGIES if s != 'none')})"
            )


def check_lora(cfg: RootConfig) -> None:
    """``model.lora`` against the rest of the run: adapters train GRPO's policy, whose reference lives in the policy
    itself (the base with the adapters off, a reference adapter, or a dense EMA delta: refexp/titan/lora.py), so
    the fields that describe a separate reference model have nothing to act on. Its shapes (a rank larger than a
    target layer, a target matching no layer) are checked against the model by ``titan.lora_targets``."""
    lora = cfg.model.lora
    if not lora.enabled:
        return
    what = f"model.lora.rank={lora.rank}"
    if cfg.algo.name != "grpo":
        raise ConfigError(f"{what} is invalid with algo={cfg.algo.name}: adapters train the GRPO stage's policy "
                          f"(the SFT stage and its cache are unchanged); expected algo=grpo, or model.lora.rank=0")
    r = cfg.reference
    for field_name, value, unset in (("reference.checkpoint", r.checkpoint, None),
                                     ("reference.offload", r.offload, False), ("reference.compile", r.compile, None)):
        if value != unset:
            raise ConfigError(f"{field_name}={value!r} is invalid with {what}: the LoRA policy's reference is the "
                              f"policy's own base weights (adapters off, or a reference adapter or EMA delta), not a "
                              f"separate model; expected {unset!r}")
    if r.dtype not in (None, cfg.training.dtype):
        raise ConfigError(f"reference.dtype={r.dtype!r} is invalid with {what}: the reference is the policy's own base "
                          f"weights, in training.dtype={cfg.training.dtype!r}; expected null")
    if cfg.parallelism.tensor_parallel_degree > 1:
        raise ConfigError(f"parallelism.tensor_parallel_degree={cfg.parallelism.tensor_parallel_degree} is invalid "
                          f"with {what}: refexp's LoRA reference parts are built for FSDP; expected 1")
    if cfg.rollout.static_decode:
        raise ConfigError(f"rollout.static_decode=true is invalid with {what}: the fixed-shape step reads the base "
                          f"weights at fixed addresses and would decode without the adapters; expected false")


def generation_budget(cfg: RootConfig) -> tuple[str, int]:
    """The field and value of the most tokens any generation asks for: ``task.max_new_tokens`` (evaluation,
    and GRPO's rollouts unless ``algo.max_new_tokens`` overrides them)."""
    algo_budget = getattr(cfg.algo, "max_new_tokens", None)
    if algo_budget is not None and algo_budget > cfg.task.max_new_tokens:
        return "algo.max_new_tokens", algo_budget
    return "task.max_new_tokens", cfg.task.max_new_tokens


def check_sequence_fits(cfg: RootConfig) -> None:
    """Prompt + generated tokens fit ``model.max_seq_len`` (the RoPE table: a longer sequence fails in the
    first generation, after the SFT stage), for the embedded task, whose prompt length the config fixes.
    Data files' prompts are measured where they are first read (``refexp.tasks.splits.check_lengths``);
    ``model.max_seq_len=None`` (the flavor's or the checkpoint's) is known only with torchtitan, and not
    checked here."""
    max_seq_len, prompt = cfg.model.max_seq_len, cfg.task.embedded_prompt_tokens()
    if max_seq_len is None or prompt is None:
        return
    field_name, budget = generation_budget(cfg)
    if prompt + budget > max_seq_len:
        raise ConfigError(f"{field_name}={budget} is invalid with model.max_seq_len={max_seq_len}: expected at most "
                          f"{max_seq_len - prompt} (a prompt of task.digits={cfg.task.digits} is {prompt} tokens, "
                          f"BOS included, and prompt + generated tokens must fit the model's positions)")


def check_start_weights(cfg: RootConfig) -> None:
    """The weights a run starts from are named and on disk. Not for a dry run, which plans from shapes
    alone (refexp/cli/dry_run.py) and whose paths may be another machine's."""
    # model.pretrained names weights the run fetches and converts itself before anything reads
    # model.hf_assets_path (refexp/components/pretrained.py), so either one names the start.
    if not cfg.sft.enable and not cfg.model.hf_assets_path and not cfg.model.pretrained:
        raise ConfigError("sft.enable=false needs model.hf_assets_path: a pretrained HF checkpoint dir for "
                          "the policy, the reference and the kl/init anchor to start from (or model.pretrained, "
                          "or sft.enable=true)")
    # A pretrained-size flavor needs its weights: OmegaConf does not let a preset's `???` override the
    # schema's None, so the requirement is checked here rather than by a MISSING default.
    if cfg.model.flavor != "debugmodel" and not cfg.model.hf_assets_path:
        raise ConfigError(f"model.flavor={cfg.model.flavor!r} needs model.hf_assets_path=DIR (the HF checkpoint "
                          f"dir of that model): refexp does not train a {cfg.model.name} {cfg.model.flavor} from "
                          f"random weights (a debugmodel flavor, e.g. model=qwen3_debug, needs none)")
    if cfg.model.hf_assets_path and not Path(cfg.model.hf_assets_path).is_dir():
        raise ConfigError(f"model.hf_assets_path={cfg.model.hf_assets_path!r} is not a directory")
    for field_name, p in (("checkpoint.initial_load_path", cfg.checkpoint.initial_load_path),
                          ("reference.checkpoint", cfg.reference.checkpoint),
                          ("sft.checkpoint", cfg.sft.checkpoint)):
        if p and not Path(p).is_dir():
            raise ConfigError(f"{field_name}={p!r} is not a directory (expected a checkpoint directory)")
