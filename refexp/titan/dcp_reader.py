"""DCP checkpoints read without running their ``.metadata``'s code: ``SafeFileSystemReader``, the storage
reader every ``dcp.load`` of refexp passes (a model-only dir, a resume through ``CheckpointManager``), and
``checked_dcp_metadata``, the one-line error for a crafted or damaged ``.metadata`` before any load.

torch's ``FileSystemReader`` unpickles ``.metadata`` with plain ``pickle``; the restricted unpickler and
what it admits are ``refexp/record/safe_pickle.py``. ``dcp.load`` turns a reader's exception into a
"metadata is None" warning and a wrapped error, so the check runs first and names the file itself.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from refexp.config import ConfigError
from refexp.record.safe_pickle import (
    UnsafePickle,
    check_storage,
    read_dcp_metadata,
    restricted_load,
)


class SafeFileSystemReader(FileSystemReader):
    """torch's ``FileSystemReader`` (torch 2.13's ``read_metadata``, line for line) with ``.metadata``
    read by ``restricted_load`` and its shard entries checked by ``check_storage`` (each a file inside the dir):
    the reader that loads reads ``.metadata`` again, so the check is here too, not only before the load."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as f:
            metadata = check_storage(restricted_load(f, name=str(path)), self.path, name=str(path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def checked_dcp_metadata(dcp_dir: str | os.PathLike) -> Metadata:
    """``dcp_dir``'s ``Metadata``, or ``ConfigError`` in one line naming its ``.metadata``: refused (a
    global no DCP checkpoint holds: nothing of it ran; a shard outside the dir: nothing was read) or unreadable
    (truncated, garbled, missing)."""
    try:
        return read_dcp_metadata(dcp_dir)
    except UnsafePickle as e:
        raise ConfigError(str(e)) from None
    except Exception as e:  # a truncated or garbled pickle raises anything from EOFError to UnpicklingError
        raise ConfigError(f"{Path(dcp_dir) / '.metadata'} is unreadable ({type(e).__name__}: {e}): "
                          f"not a complete DCP checkpoint") from None
