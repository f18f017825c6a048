"""Checks of a task's data sources and reward hook that need no data loaded, run by
``refexp.run.validate`` so that a wrong path, an unreachable Hub or a bad ``task.reward`` fails before
any model is built.

A ``task.*_path`` value is a local file or folder when one exists at that path; otherwise a value
shaped like a Hub dataset id (``owner/name`` or ``name``, no data-file extension) is a Hugging Face
Hub id. Reaching the Hub is checked with one metadata request bounded by ``HUB_TIMEOUT_S`` (a
machine without a network must fail in seconds, not after ``datasets``' retries), or not at all
when ``HF_HUB_OFFLINE`` is set.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Optional

from refexp.config import ConfigError, TaskConfig

HUB_TIMEOUT_S = 5.0
"""The longest the Hub reachability check waits (DNS included: it runs in a thread joined with this)."""

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(?:/[A-Za-z0-9][\w.-]*)?")
_DATA_EXTENSIONS = (".jsonl", ".json", ".parquet", ".csv", ".txt", ".arrow")
_TRUE = {"1", "ON", "YES", "TRUE"}


def looks_like_hub_id(path: str) -> bool:
    """``owner/name`` or ``name`` and not an existing local path. A missing ``data/train.jsonl`` is a
    missing file, not a Hub id: ids do not end in a data-file extension."""
    return (not os.path.exists(path) and _HUB_ID.fullmatch(path) is not None
            and not path.lower().endswith(_DATA_EXTENSIONS))


def check_sources(task_cfg: TaskConfig) -> None:
    """ConfigError naming the field for a data path that is neither a local path nor a reachable Hub
    dataset, for a ``task.reward`` that does not import (``refexp.tasks.rewards.load_reward``), and for a reward
    model dir that is not a one-label sequence classifier (``check_reward_fields``)."""
    from refexp.tasks.rewards import load_reward

    for field_name, path in (("task.train_path", task_cfg.train_path), ("task.eval_path", task_cfg.eval_path),
                             ("task.val_path", task_cfg.val_path), ("task.preference_path", task_cfg.preference_path)):
        if path:
            check_source(field_name, path, task_cfg.dataset_config)
    if task_cfg.reward is not None:
        load_reward(task_cfg.reward)
    check_reward_fields(task_cfg)


def check_reward_fields(task_cfg: TaskConfig) -> None:
    """Every reward model dir is a one-label sequence classifier with a tokenizer (its config.json read) and
    every function of ``task.reward_funcs`` imports (``refexp.tasks.reward_sum``)."""
    from refexp.tasks.reward_model import STAGE_MODEL, check_reward_model_dir, is_reward_model_entry
    from refexp.tasks.reward_sum import VERIFIER
    from refexp.tasks.rewards import load_reward

    for field_name, path in (("task.reward_model", task_cfg.reward_model),
                             ("task.gold_reward_model", task_cfg.gold_reward_model)):
        if path and path != STAGE_MODEL:  # rm: the stage's model, made by refexp (refexp/algos/rm.py)
            check_reward_model_dir(field_name, path)
    for entry in task_cfg.reward_funcs:
        if entry in (VERIFIER, STAGE_MODEL):
            continue
        if is_reward_model_entry(entry):
            check_reward_model_dir("task.reward_funcs[]", entry)
        else:
            load_reward(entry, "task.reward_funcs[]")


def check_source(field_name: str, path: str, config: Optional[str] = None) -> None:
    if os.path.exists(path):
        return
    if not looks_like_hub_id(path):
        raise ConfigError(f"{field_name}={path!r} does not exist: expected a local .jsonl/.json/.parquet/.csv "
                          f"file, a folder, or a Hugging Face Hub dataset id (owner/name)")
    problem = hub_problem(path)
    if problem == "offline" or problem == "unreachable":
        local = path.rsplit("/", 1)[-1]
        args = f"'{path}'" + (f", '{config}'" if config else "")
        why = "offline: HF_HUB_OFFLINE is set" if problem == "offline" else "offline"
        raise ConfigError(
            f"{field_name}={path!r} is not a local file or folder and the Hugging Face Hub cannot be reached "
            f"({why}): on a machine with a network run `python -c \"import datasets; "
            f"datasets.load_dataset({args}).save_to_disk('{local}')\"` and pass {field_name}={local} "
            f"(or a .jsonl/.parquet file)")
    if problem is not None:
        raise ConfigError(f"{field_name}={path!r} is not a local file or folder, and as a Hugging Face Hub "
                          f"dataset id: {problem}")


def hub_problem(repo_id: str) -> Optional[str]:
    """None when ``repo_id`` is a dataset on the Hub; ``"offline"`` (HF_HUB_OFFLINE set),
    ``"unreachable"`` (no answer within ``HUB_TIMEOUT_S``), or what the Hub said was wrong."""
    if (os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE
            or os.environ.get("HF_DATASETS_OFFLINE", "").upper() in _TRUE):
        return "offline"
    result: list = []

    def ask() -> None:
        try:
            _dataset_info(repo_id)
            result.append(None)
        except BaseException as e:  # handed to the caller's thread
            result.append(e)

    thread = threading.Thread(target=ask, daemon=True)  # a hung DNS lookup must not keep the run waiting
    thread.start()
    thread.join(HUB_TIMEOUT_S)
    if not result:
        return "unreachable"
    error = result[0]
    if error is None:
        return None
    from huggingface_hub.errors import GatedRepoError, OfflineModeIsEnabled, RepositoryNotFoundError

    if isinstance(error, GatedRepoError):
        return f"gated ({error}); accept its terms on the Hub and log in (`hf auth login`)"
    if isinstance(error, RepositoryNotFoundError):
        return "no such dataset on the Hub (or it is private: log in with `hf auth login`)"
    if isinstance(error, OfflineModeIsEnabled) or _is_network_error(error):
        return "unreachable"
    return f"{type(error).__name__}: {error}"


def _dataset_info(repo_id: str) -> None:
    from huggingface_hub import HfApi

    HfApi().dataset_info(repo_id, timeout=HUB_TIMEOUT_S)


def _is_network_error(error: BaseException) -> bool:
    """A connection, DNS or timeout failure (httpx under huggingface_hub 1.x, requests before)."""
    names = {c.__name__ for c in type(error).__mro__}
    return bool(names & {"TransportError", "ConnectionError", "Timeout", "TimeoutError", "OSError"})
