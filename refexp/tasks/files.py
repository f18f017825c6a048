"""Open a local data file as a ``datasets.Dataset``: ``.jsonl``/``.json``/``.parquet``, or a directory
written by ``save_to_disk``. Nothing is downloaded; every failure is a ``ConfigError`` naming the path.
"""

from __future__ import annotations

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
        raise ConfigError(f"data file {path!r} could not be read as {builder}: {e}") from e


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
    """ConfigError naming the file (and row 0, where every row lacks it) for a missing column."""
    missing = [c for c in columns if c not in ds.column_names]
    if missing:
        raise ConfigError(
            f"{path}: row 0: missing column {missing[0]!r}; expected {what} "
            f"(columns found: {', '.join(ds.column_names) or 'none'})"
        )
