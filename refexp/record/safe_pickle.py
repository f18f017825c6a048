"""DCP's ``.metadata`` read without running code: a restricted unpickler.

``torch.distributed.checkpoint.FileSystemReader.read_metadata`` reads ``.metadata`` with a plain
``pickle.load``, and a pickle can name any callable to be called while it loads (``__reduce__``): a
checkpoint dir from someone else, or one planted in a shared ``REFEXP_CACHE``, would run its code in
the run's process. This unpickler resolves only the globals a DCP ``.metadata`` is made of (the
"Restricting Globals" recipe of Python's ``pickle`` docs) and refuses any other with ``UnsafePickle``
before anything is called. A manifest's checksum beside the file (``record/checkpoints.py``) catches
corruption, not someone who can write the manifest too, so verified checkpoints are read this way as
well.

What a ``.metadata`` holds (torch 2.13, ``torch/distributed/checkpoint/metadata.py``): ``Metadata`` and
its storage-metadata dataclasses and enums, ``filesystem._StorageInfo``, ``torch.Size``, dtypes, a
layout through ``torch.serialization._get_layout`` (a lookup of torch's layouts by name), the
checkpoint id as a ``pathlib`` path, and plain containers (dict, list, tuple, str, numbers, bool,
None: pickle opcodes, no globals). Torch-free at module level: ``torch`` is imported only when a
pickle names one of its classes.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any, BinaryIO

METADATA_MODULE = "torch.distributed.checkpoint.metadata"
"""Every class of this module is a checkpoint-metadata record (dataclasses and enums)."""
ALLOWED = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "Path"), ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"),
    ("pathlib", "PurePath"), ("pathlib", "PurePosixPath"), ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "slice"), ("builtins", "complex"),
}
"""Globals admitted by name besides ``METADATA_MODULE``'s classes and ``torch``'s dtypes."""


class UnsafePickle(pickle.UnpicklingError):
    """A pickle names a global outside ``ALLOWED``; nothing of it was called. The message is one line
    naming the file."""


class _Restricted(pickle.Unpickler):
    def __init__(self, f: BinaryIO, name: str) -> None:
        super().__init__(f)
        self.name = name

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED:
            return super().find_class(module, name)
        if module == METADATA_MODULE:
            obj = super().find_class(module, name)
            if isinstance(obj, type):  # its dataclasses and enums, not a function it happens to import
                return obj
        if module == "torch":
            import torch

            obj = getattr(torch, name, None)
            if isinstance(obj, torch.dtype):
                return obj
        raise UnsafePickle(
            f"{self.name}: refused to load: it names {module}.{name}, which a DCP .metadata never holds "
            f"(only {METADATA_MODULE} records, sizes, dtypes and plain containers), so it was not written by "
            f"torch.distributed.checkpoint and unpickling it could run code; nothing of it was run")


def restricted_load(f: BinaryIO, *, name: str) -> Any:
    """``pickle.load(f)`` admitting only a DCP ``.metadata``'s globals; ``UnsafePickle`` (naming ``name``)
    for any other."""
    return _Restricted(f, name).load()


def read_dcp_metadata(dcp_dir: str | os.PathLike) -> Any:
    """The ``Metadata`` of the DCP checkpoint in ``dcp_dir`` (its ``.metadata``), read by
    ``restricted_load``: ``UnsafePickle`` for a crafted file, the usual ``OSError``/``EOFError``/
    ``UnpicklingError`` for a missing or damaged one."""
    path = Path(dcp_dir) / ".metadata"
    with open(path, "rb") as f:
        return restricted_load(f, name=str(path))
