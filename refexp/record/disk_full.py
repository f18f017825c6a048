"""A full disk named as the cause of the error it shows up as.

A write to a full file system fails with ``OSError(ENOSPC)`` (or ``EDQUOT`` past a quota) where Python writes, but
with ``RuntimeError: [enforce fail at inline_container.cc:...] ... file write failed`` where torch's zip writer
(``torch.save``, a DCP shard) does: that message carries no errno, so there the file system the run writes to is
asked whether it has room left. ``describe_error`` is the one text of a run's error (``status.json``'s ``error``,
the one line ``refexp`` prints).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Iterator, Optional

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
TORCH_WRITE_FAILED = ("file write failed", "PytorchStreamWriter failed writing")
"""What torch's ``PyTorchStreamWriter`` says when a write to its file fails (caffe2/serialize/inline_container.cc)."""
ROOM_BYTES = 1 << 20
"""Less free space than this on the run's file system: full, for a write torch reports without an errno."""


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and every error it was raised from or while handling: both links of each (``__cause__`` and
    ``__context__``; an error raised ``from`` one while handling a full disk has the full disk in its context)."""
    seen: set[int] = set()
    todo: list[BaseException] = [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__context__, e.__cause__]  # the cause first


def free_bytes(where: str | os.PathLike) -> Optional[int]:
    """Bytes an unprivileged writer may still use on the file system of ``where`` (its nearest existing
    ancestor); None when it cannot be asked."""
    path = Path(where)
    existing = next((p for p in [path, *path.parents] if p.exists()), None)
    try:
        st = os.statvfs(existing) if existing is not None else None
    except OSError:
        return None
    return None if st is None else st.f_bavail * st.f_frsize


def disk_full(error: BaseException, where: str | os.PathLike | None = None) -> bool:
    """Whether ``error`` (or an error it was raised from or while handling) is a write refused by a full disk: an
    ``OSError`` with ENOSPC or EDQUOT, or torch's failed file write while the file system of ``where`` has no room
    left."""
    for e in _chain(error):
        if isinstance(e, OSError) and e.errno in FULL_ERRNOS:
            return True
        if isinstance(e, RuntimeError) and any(s in str(e) for s in TORCH_WRITE_FAILED) and where is not None:
            free = free_bytes(where)
            if free is not None and free < ROOM_BYTES:
                return True
    return False


def describe_error(error: BaseException, where: str | os.PathLike | None = None) -> str:
    """``Type: message``, led by ``No space left on device (the file system of WHERE is full)`` when a full disk
    caused it (``disk_full``)."""
    text = f"{type(error).__name__}: {error}"
    if not disk_full(error, where):
        return text
    place = f" (the file system of {where} is full)" if where is not None else ""
    return f"No space left on device{place}: {text.splitlines()[0] if text else text}"
