"""Open a task's data as a ``datasets.Dataset``: whatever ``datasets.load_dataset`` accepts. A local
``.jsonl``/``.json``/``.parquet``/``.csv`` file, a directory written by ``save_to_disk``, a data
directory (``load_dataset(dir)``), or a Hugging Face Hub dataset id (``refexp.tasks.sources`` checks
before any model is built that the Hub can be reached). Every failure is a ``ConfigError`` naming the path.
"""

from __future__ import annotations

import json
import os
from typing import Optional

import datasets

from refexp.config import ConfigError

_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def load_table(path: str, *, split: Optional[str] = None, config: Optional[str] = None,
               cache_dir: Optional[str] = None) -> datasets.Dataset:
    """The rows of ``path``. ``split`` picks one split of a source that has several (a saved
    ``DatasetDict``, a data directory, a Hub dataset; None: the only one); a single file is one split.
    ``config`` is a Hub dataset's config name. ``cache_dir`` is where ``datasets`` keeps its Arrow
    copy (None = its default, ``~/.cache/huggingface/datasets``)."""
    if os.path.isdir(path):
        if _is_saved(path):
            return _load_saved(path, split)
        return _load_dataset(path, path, config=config, split=split, cache_dir=cache_dir)
    if not os.path.isfile(path):
        from refexp.tasks.sources import looks_like_hub_id

        if not looks_like_hub_id(path):
            raise ConfigError(f"data file {path!r} does not exist")
        return _load_dataset(path, path, config=config, split=split, cache_dir=cache_dir)
    builder = _BUILDERS.get(os.path.splitext(path)[1].lower())
    if builder is None:
        raise ConfigError(
            f"data file {path!r} has an unknown extension: expected .jsonl, .json, .parquet, .csv, "
            f"a directory (save_to_disk's or a data directory) or a Hugging Face Hub dataset id"
        )
    if os.path.getsize(path) == 0:  # datasets' own error for it is an empty message
        raise ConfigError(f"data file {path!r} is empty (0 bytes): expected one row per line (.jsonl) or a table")
    try:
        return datasets.load_dataset(builder, data_files=path, split="train", cache_dir=cache_dir)
    except Exception as e:  # pyarrow/json errors: a value of the wrong type, a broken line, ...
        row_problem = _json_row_problem(path) if builder == "json" else None
        if row_problem is not None:
            raise ConfigError(f"{path}: {row_problem}") from e
        raise ConfigError(f"data file {path!r} could not be read as {builder}: {e}") from e


def _json_row_problem(path: str) -> Optional[str]:
    """``"row i: ..."`` for the first row that breaks a JSON(L) file, or None if no row does.

    Only run after ``datasets`` failed: its errors name no row, and datasets 4.x's JSON loader
    fails outright (``KeyError``) when a later row lacks a key the first row has.
    """
    try:
        rows = list(_json_rows(path))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not rows:
        return "empty: no rows, only blank lines"
    first = None
    for i, row in enumerate(rows):
        if isinstance(row, json.JSONDecodeError):
            return f"row {i}: not valid JSON ({row})"
        if not isinstance(row, dict):
            return f"row {i}: {type(row).__name__} instead of a JSON object"
        first = row if first is None else first
        columns = f"(row 0 has columns {', '.join(first)})"
        for key in first:
            if key not in row:
                return f"row {i}: missing column {key!r} {columns}"
        for key in row:
            if key not in first:
                return f"row {i}: column {key!r} that row 0 lacks {columns}"
    return None


def _json_rows(path: str):
    """Each row of a JSON Lines file (a JSONDecodeError for a broken line), or of a JSON array."""
    with open(path) as f:
        if not path.lower().endswith(".jsonl"):
            rows = json.load(f)
            yield from rows if isinstance(rows, list) else ()  # {"field": [...]}: no rows to check
            return
        for line in f:
            if line.strip():  # blank lines are not rows
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as e:
                    yield e


def _load_dataset(path: str, source: str, *, config: Optional[str], split: Optional[str],
                  cache_dir: Optional[str]) -> datasets.Dataset:
    """``datasets.load_dataset`` of a data directory or Hub id, one split of it."""
    try:
        loaded = datasets.load_dataset(source, config, cache_dir=cache_dir)
    except Exception as e:  # no data files, an unknown config, the Hub gone since validate, ...
        raise ConfigError(f"{path!r} could not be loaded by datasets.load_dataset: {type(e).__name__}: {e}") from e
    return _one_split(path, loaded, split)


def _is_saved(path: str) -> bool:
    """A directory ``save_to_disk`` wrote: a ``DatasetDict`` (``dataset_dict.json``) or a ``Dataset``."""
    return any(os.path.isfile(os.path.join(path, f)) for f in ("dataset_dict.json", "state.json"))


def _load_saved(path: str, split: Optional[str] = None) -> datasets.Dataset:
    try:
        saved = datasets.load_from_disk(path)
    except FileNotFoundError as e:
        raise ConfigError(f"directory {path!r} is not a dataset written by save_to_disk ({e})") from e
    return _one_split(path, saved, split)


def _one_split(path: str, saved, split: Optional[str]) -> datasets.Dataset:
    if isinstance(saved, datasets.DatasetDict):
        if split is not None and (split in saved or len(saved) > 1):  # a lone split is the data, any name
            if split not in saved:
                raise ConfigError(f"{path!r} has no split {split!r}: expected one of {', '.join(saved)} "
                                  f"(task.train_split, task.eval_split and task.val_split choose it)")
            return saved[split]
        if len(saved) != 1:
            splits = ", ".join(os.path.join(path, s) for s in saved)
            raise ConfigError(f"{path!r} holds several splits; point at one of them: {splits}")
        (saved,) = saved.values()
    return saved


def require_columns(ds: datasets.Dataset, path: str, columns: tuple[str, ...], what: str) -> None:
    """ConfigError naming the file for a file with no rows, or (row 0, where every row lacks it) a missing
    column; ``what`` describes the expected format."""
    if len(ds) == 0:
        raise ConfigError(f"{path}: no rows; expected {what}")
    missing = [c for c in columns if c not in ds.column_names]
    if missing:
        raise ConfigError(
            f"{path}: row 0: missing column {missing[0]!r}; expected {what} "
            f"(columns found: {', '.join(ds.column_names) or 'none'})"
        )
