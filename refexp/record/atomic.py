"""Atomic writes: a reader (another rank, a concurrent job of a sweep, the report) sees either the
old file/directory or the complete new one, never a half-written one.

Everything is written under a private temporary name in the destination's own directory (the same
file system, so the final ``os.replace`` is an atomic rename) and then renamed into place. A temp
name is unique per call (pid + random), so threads and processes writing the same destination at
once each rename a complete copy and the last rename wins. A write that fails leaves no temp behind.
Temps are made with ``open``/``mkdir`` (not ``mkstemp``/``mkdtemp``), so results get the usual
permissions (umask): caches may be shared by the users of a cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator


def _temp_name(path: Path) -> Path:
    return path.with_name(f".tmp-{path.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


@contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w", **open_kwargs) -> Iterator[Any]:
    """``with atomic_file(p, "wb") as f: ...``: ``f`` writes a temp file that replaces ``p`` on a clean exit."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_name(p)
    try:
        with open(tmp, mode.replace("w", "x"), **open_kwargs) as f:
            yield f
        os.replace(tmp, p)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: str | os.PathLike, text: str, *, encoding: str | None = None) -> Path:
    with atomic_file(path, "w", encoding=encoding) as f:
        f.write(text)
    return Path(path)


def json_default(v: Any) -> Any:
    if hasattr(v, "tolist"):  # torch tensors, numpy arrays and scalars
        return v.tolist()
    raise TypeError(f"Object of type {type(v).__name__} is not JSON serializable")


def write_json_atomic(path: str | os.PathLike, obj: Any) -> Path:
    """``obj`` as indented JSON (tensors and arrays as numbers/lists)."""
    return write_text_atomic(path, json.dumps(obj, indent=2, default=json_default))


def torch_save_atomic(obj: Any, path: str | os.PathLike) -> Path:
    import torch

    with atomic_file(path, "wb") as f:
        torch.save(obj, f)
    return Path(path)


def remove_temporaries(final: str | os.PathLike) -> list[Path]:
    """Delete the temporaries of every write to ``final`` (``atomic_file``/``atomic_dir``); returns them.

    A process killed mid-write (SIGKILL, a node failure) runs no ``finally`` and leaves its temporary
    behind. Only call this where no other writer of ``final`` can be running, e.g. under the lock that
    serialises its writers (refexp/algos/sft.py).
    """
    out = Path(final)
    stale = sorted(out.parent.glob(f".tmp-{out.name}-*")) if out.parent.is_dir() else []
    for p in stale:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    return stale


@contextmanager
def atomic_dir(final: str | os.PathLike, *, is_complete: Callable[[Path], bool]) -> Iterator[Path]:
    """``with atomic_dir(out, is_complete=...) as tmp:`` fill ``tmp``; on a clean exit it is renamed to ``out``.

    ``is_complete(out)`` says whether ``out`` holds a finished result (e.g. its marker file, written
    last). When the rename fails because ``out`` is already there: a complete ``out`` is another
    writer's that won the race, and is kept (the results are identical); an incomplete one is
    removed and replaced.
    """
    out = Path(final)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_name(out)
    tmp.mkdir()
    try:
        yield tmp
        try:
            os.replace(tmp, out)
        except OSError:
            if is_complete(out):
                return  # a lost race: keep the winner's
            if not out.exists():
                raise  # a real I/O failure
            shutil.rmtree(out)
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
