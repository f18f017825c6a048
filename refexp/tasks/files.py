"""Open a local data file as a ``datasets.Dataset``: ``.jsonl``/``.json``/``.parquet``, or a directory
written by ``save_to_disk``. Nothing is downloaded; every failure is a ``ConfigError`` naming the path.
"""

from __future__ import annotations

import json
import os
from typing import Optional

import datasets

from refexp.config import ConfigError

_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def load_table(path: str, *, cache_dir: Optional[str] = None) -> datasets.Dataset:
    """The rows of ``path``. ``cache_dir`` is where ``datasets`` keeps its Arrow copy of a file
    (None = its default, ``~/.cache/huggingface/datasets``)."""
    if os.path.isdir(path):
        return _load_saved(path)
    if not os.path.isfile(path):
        raise ConfigError(f"data file {path!r} does not exist")
    builder = _BUILDERS.get(os.path.splitext(path)[1].lower())
    if builder is None:
        raise ConfigError(
            f"data file {path!r} has an unknown extension: expected .jsonl, .json, .parquet "
            f"or a directory written by datasets' save_to_disk"
        )
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


def _load_saved(path: str) -> datasets.Dataset:
    try:
        saved = datasets.load_from_disk(path)
    except FileNotFoundError as e:
        raise ConfigError(f"directory {path!r} is not a dataset written by save_to_disk ({e})") from e
    if isinstance(saved, datasets.DatasetDict):
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
