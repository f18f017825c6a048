"""``task_fingerprint``: a short, stable hash of what determines a task's data and tokens, used to
key caches (the SFT checkpoint, precomputed reference log-probs).

Local files are identified by absolute path, size and modification time rather than by content:
hashing a multi-GB preference set on every start would cost more than it saves, and a file
edited in place (new mtime) still gets a new fingerprint. A Hub dataset is identified by its id
(with the config and split fields).
"""

from __future__ import annotations

import os
from functools import partial
from typing import Optional

from refexp.config import TaskConfig
from refexp.config.diff import in_cache_terms
from refexp.record.hashing import stable_hash
from refexp.tasks.arithmetic import arithmetic_fingerprint
from refexp.tasks.reasoning_gym import version as gym_version


def task_fingerprint(task_cfg: TaskConfig, cache_dir: str | None = None) -> str:
    """16 hex characters; equal for configs that build the same data with the same tokenizer. A file or dir inside
    ``cache_dir`` (``sft.cache_dir``: ``task.tokenizer_path`` is ``model.pretrained``'s converted dir) counts by
    its place in the cache (``in_cache_terms``), so a copied or moved cache keeps the key."""
    identity = partial(_path_identity, cache_dir=cache_dir)
    key: dict = {"name": task_cfg.name, "preference": identity(task_cfg.preference_path)}
    if task_cfg.name == "arithmetic":
        key["arithmetic"] = arithmetic_fingerprint(task_cfg)
        if task_cfg.retained_ops():  # which rows RL prompts, DPO pairs and eval/accuracy read (added only then)
            key["rl_ops"] = sorted(set(task_cfg.rl_ops))
    elif task_cfg.name == "reasoning_gym":  # the generator's version, what it is asked for and the split seeds
        key["reasoning_gym"] = [gym_version(), task_cfg.dataset, task_cfg.dataset_kwargs, task_cfg.retention_datasets,
                                task_cfg.num_train, task_cfg.num_eval, task_cfg.data_seed, task_cfg.system_prompt,
                                task_cfg.chat_template, task_cfg.answer_prefill]
    else:
        key.update(
            train=identity(task_cfg.train_path),
            eval=identity(task_cfg.eval_path),
            # Without an eval file the held-out slice is cut from train by these two.
            holdout=None if task_cfg.eval_path else [task_cfg.num_eval, task_cfg.data_seed],
            source=[task_cfg.dataset_config, task_cfg.train_split, task_cfg.eval_split,
                    task_cfg.question_column, task_cfg.answer_column],
        )
    if task_cfg.preference_path is not None:
        key["preference_source"] = [task_cfg.dataset_config, task_cfg.train_split, task_cfg.prompt_column,
                                    task_cfg.chosen_column, task_cfg.rejected_column]
    # Added only when set, so the default embedded task keeps its key (and its cached SFT model).
    if task_cfg.val_path is not None or task_cfg.val_share():
        # A carved validation slice changes the training rows; a val file changes what SFT stops on.
        key["val"] = [identity(task_cfg.val_path), task_cfg.val_split, task_cfg.val_share(),
                      task_cfg.data_seed]
    if task_cfg.chat_template:  # the rendered prompts are the data; added only when set (keys above stay)
        key["chat"] = [task_cfg.system_prompt, task_cfg.chat_template_kwargs]
    if task_cfg.reward is not None:
        key["reward"] = task_cfg.reward  # held-out accuracy, hence SFT's early stop, is measured with it
    # None = the char tokenizer, whose vocabulary is versioned with the arithmetic format.
    key["tokenizer"] = identity(task_cfg.tokenizer_path, only=TOKENIZER_FILES)
    return stable_hash(key, 16)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json")
"""What ``TextTokenizer.from_dir`` reads (``generation_config.json``: the stop ids): a checkpoint dir's
weights do not change the tokens."""


def _path_identity(path: Optional[str], only: Optional[tuple[str, ...]] = None, cache_dir: str | None = None):
    """``[abs path, [(relative file, size, mtime_ns), ...]]`` of a file or directory (None for None), the path in
    cache terms when it lies in ``cache_dir``; ``only`` restricts a directory to those file names."""
    if path is None:
        return None
    if not os.path.exists(path):
        return ["hub", path]  # refexp.tasks.sources has checked that it is a Hub id
    path = os.path.abspath(path)
    if os.path.isfile(path):
        st = os.stat(path)
        return [in_cache_terms(path, cache_dir), [["", st.st_size, st.st_mtime_ns]]]
    files = []
    for root, _, names in os.walk(path):
        for name in names:
            if name.startswith("cache-") or (only is not None and name not in only):
                continue  # datasets' own cache files inside a saved dir change without the data
            full = os.path.join(root, name)
            st = os.stat(full)
            files.append([os.path.relpath(full, path), st.st_size, st.st_mtime_ns])
    return [in_cache_terms(path, cache_dir), sorted(files)]
