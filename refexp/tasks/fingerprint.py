"""``task_fingerprint``: a short, stable hash of what determines a task's data and tokens, used to
key caches (the SFT checkpoint, precomputed reference log-probs).

Local files are identified by absolute path, size and modification time rather than by content:
hashing a multi-GB preference set on every start would cost more than it saves, and a file
edited in place (new mtime) still gets a new fingerprint.
"""

from __future__ import annotations

import os
from typing import Optional

from refexp.config import TaskConfig
from refexp.hashing import stable_hash
from refexp.tasks.arithmetic import arithmetic_fingerprint


def task_fingerprint(task_cfg: TaskConfig) -> str:
    """16 hex characters; equal for configs that build the same data with the same tokenizer."""
    key: dict = {"name": task_cfg.name, "preference": _path_identity(task_cfg.preference_path)}
    if task_cfg.name == "arithmetic":
        key["arithmetic"] = arithmetic_fingerprint(task_cfg)
    else:
        key.update(
            train=_path_identity(task_cfg.train_path),
            eval=_path_identity(task_cfg.eval_path),
            # Without an eval file the held-out slice is cut from train by these two.
            holdout=None if task_cfg.eval_path else [task_cfg.num_eval, task_cfg.data_seed],
        )
    # None = the char tokenizer, whose vocabulary is versioned with the arithmetic format.
    key["tokenizer"] = _path_identity(task_cfg.tokenizer_path, only=TOKENIZER_FILES)
    return stable_hash(key, 16)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
"""What ``TextTokenizer.from_dir`` reads: a checkpoint dir's weights do not change the tokens."""


def _path_identity(path: Optional[str], only: Optional[tuple[str, ...]] = None):
    """``[abs path, [(relative file, size, mtime_ns), ...]]`` of a file or directory (None for None);
    ``only`` restricts a directory to those file names."""
    if path is None:
        return None
    path = os.path.abspath(path)
    if os.path.isfile(path):
        st = os.stat(path)
        return [path, [["", st.st_size, st.st_mtime_ns]]]
    files = []
    for root, _, names in os.walk(path):
        for name in names:
            if name.startswith("cache-") or (only is not None and name not in only):
                continue  # datasets' own cache files inside a saved dir change without the data
            full = os.path.join(root, name)
            st = os.stat(full)
            files.append([os.path.relpath(full, path), st.st_size, st.st_mtime_ns])
    return [path, sorted(files)]
