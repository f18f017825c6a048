"""Typed schema under the YAML in ``conf/``: one dataclass per config group (or per option of ``algo/``
and ``reference/``), registered in Hydra's ConfigStore by ``register_configs``.

A typo in an override or a value of the wrong type fails at compose time, and the ``__post_init__``
checks fail before any model is built (``to_object``). The dataclasses hold every default; an option
file in ``conf/`` sets only what differs from them (tests/test_shipped_configs.py keeps it so).

Choices (a strategy, a loss type, an objective) are named once in ``refexp/choices.py``; see there why the
fields holding them are typed ``str``.

Field names mirror torchtitan 0.3.0's config dataclasses (``torchtitan/config/configs.py``,
``CheckpointManager.Config``) where a group mirrors one, so torchtitan's docs carry over.

Modules: ``errors`` (ConfigError and the checks), ``model`` (model, parallelism, compile), ``runtime``
(checkpoint, comm, training), ``task``, ``logger``, ``blocks`` (the root's eval, sft and rm), ``comparison`` (the
pre-registered comparison), ``algo``, ``reference``, ``root`` (RootConfig, registration, to_object), ``search`` (a
search selects on validation).
"""

from .algo import ALGO_SCHEMAS, AlgoConfig, DPOConfig, GRPOConfig, RMConfig, SFTAlgoConfig
from .blocks import EvalConfig, RMStageConfig, SFTConfig
from .comparison import ComparisonConfig, MatchedConfig, SelectionConfig
from .errors import ConfigError
from .logger import LoggerConfig
from .model import CompileConfig, ModelConfig, ParallelismConfig
from .reference import (
    REFERENCE_SCHEMAS,
    EMAReferenceConfig,
    FixedReferenceConfig,
    KLTriggeredReferenceConfig,
    NoReferenceConfig,
    PeriodicResetReferenceConfig,
    ReferenceConfig,
)
from .rollout import RolloutConfig
from .root import (
    GROUP_SCHEMAS,
    OPTION_SCHEMAS,
    RootConfig,
    check_cross_fields,
    check_known_fields,
    register_configs,
    schema_name,
    to_object,
)
from .runtime import ActivationCheckpointConfig, CheckpointConfig, CommConfig, TrainingConfig
from .search import check_search_validation
from .task import TaskConfig

__all__ = [
    "ALGO_SCHEMAS", "ActivationCheckpointConfig", "GROUP_SCHEMAS", "OPTION_SCHEMAS", "REFERENCE_SCHEMAS",
    "AlgoConfig", "CheckpointConfig", "CommConfig", "ComparisonConfig", "CompileConfig", "ConfigError",
    "DPOConfig", "EMAReferenceConfig", "EvalConfig", "FixedReferenceConfig", "GRPOConfig", "MatchedConfig",
    "KLTriggeredReferenceConfig", "LoggerConfig", "ModelConfig", "NoReferenceConfig", "ParallelismConfig",
    "PeriodicResetReferenceConfig", "RMConfig", "RMStageConfig", "ReferenceConfig", "RolloutConfig", "RootConfig",
    "SFTAlgoConfig", "SFTConfig",
    "SelectionConfig", "TaskConfig",
    "TrainingConfig", "check_cross_fields", "check_known_fields", "check_search_validation", "register_configs",
    "schema_name", "to_object",
]
