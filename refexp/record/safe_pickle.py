"""DCP's ``.metadata`` read without running code: a restricted unpickler.

``torch.distributed.checkpoint.FileSystemReader.read_metadata`` reads ``.metadata`` with a plain
``pickle.load``, and a pickle can name any callable to be called while it loads (``__reduce__``): a
checkpoint dir from someone else, or one planted in a shared ``REFEXP_CACHE``, would run its code in
the run's process. This unpickler (the "Restricting Globals" recipe of Python's ``pickle`` docs) resolves
only the globals a DCP ``.metadata`` is made of and refuses any other with ``UnsafePickle`` before anything
is called. A manifest's checksum beside the file (``record/checkpoints.py``) catches corruption, not someone
who can write the manifest too, so verified checkpoints are read this way as well.

What it admits, each by its exact (module, name) pair (``ALLOWED``; torch 2.13's
``torch/distributed/checkpoint/metadata.py`` and ``filesystem.py``; every pair is one that a checkpoint
refexp writes holds: an SFT model, a run's step with optimizer, scheduler and train state):

- DCP's records: ``Metadata``, ``StorageMeta``, ``MetadataIndex``, ``TensorStorageMetadata``,
  ``BytesStorageMetadata``, ``ChunkStorageMetadata``, ``TensorProperties`` (dataclasses), its enum
  ``_MEM_FORMAT_ENCODING``, and ``filesystem._StorageInfo`` (a shard's file, offset and length);
- ``torch.Size``; a dtype as ``torch.<name>`` (a value of ``torch``'s own namespace that is a
  ``torch.dtype``); ``torch.serialization._get_layout`` (a lookup of torch's layouts by name);
- ``pathlib.PosixPath`` (the checkpoint id; its home is ``pathlib._local`` from Python 3.13 on).

Plain containers (dict, list, tuple, str, bytes, numbers, bool, None) are pickle opcodes, no globals.

Nothing else, and no name by another route: pickle protocol >= 4 resolves a dotted name (``a.b.c``) by
walking attributes from its module, so an admitted module reaches everything it imports
(``torch.distributed.checkpoint.metadata`` + ``torch._strobelight.cli_function_profiler.subprocess.Popen``
is ``subprocess.Popen``); a dotted name is refused. A name is looked up in its module's own namespace (no
``__getattr__`` hook, no attribute walk), and the object found must live there: its ``__module__`` and
``__qualname__`` are the pair named, so a name one of those modules merely imports is refused. Setting an
object's state (pickle's ``BUILD``) is admitted for instances of DCP's dataclasses only: a pickle cannot
overwrite an attribute of an admitted class, function or enum member. torch's own weights-only unpickler
(``torch._weights_only_unpickler``) cannot stand in: it knows protocol 2's opcodes, and DCP writes protocol 4.
Torch-free at module level: ``torch`` is imported only when a pickle names one of its modules.

What it admits can still point elsewhere: a ``_StorageInfo``'s ``relative_path`` is opened under the checkpoint
dir as found, so an absolute path, a ``..`` or a link out of the dir would read any file the run can read into the
weights. ``check_storage`` (run by ``read_dcp_metadata`` and ``SafeFileSystemReader``) refuses such an entry, and
an offset or length that is no non-negative int.
"""

from __future__ import annotations

import importlib
import os
import pickle
from pathlib import Path
from types import FunctionType
from typing import Any, BinaryIO, ClassVar

METADATA_MODULE = "torch.distributed.checkpoint.metadata"
FILESYSTEM_MODULE = "torch.distributed.checkpoint.filesystem"
RECORDS = frozenset({
    (METADATA_MODULE, "Metadata"), (METADATA_MODULE, "StorageMeta"), (METADATA_MODULE, "MetadataIndex"),
    (METADATA_MODULE, "TensorStorageMetadata"), (METADATA_MODULE, "BytesStorageMetadata"),
    (METADATA_MODULE, "ChunkStorageMetadata"), (METADATA_MODULE, "TensorProperties"),
    (FILESYSTEM_MODULE, "_StorageInfo"),
})
"""DCP's dataclasses: the only objects whose state a pickle may set (``BUILD``)."""
ALLOWED = RECORDS | {
    (METADATA_MODULE, "_MEM_FORMAT_ENCODING"),  # TensorProperties' memory format, an Enum
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # how torch pickles a layout: its name, looked up in torch
    ("pathlib", "PosixPath"), ("pathlib._local", "PosixPath"),  # StorageMeta.checkpoint_id (3.13: pathlib._local)
}
"""The (module, qualified name) pairs admitted besides ``torch``'s dtypes."""
PATHLIB_HOMES = frozenset({"pathlib", "pathlib._local"})
"""Where ``PosixPath`` lives: ``pathlib`` before Python 3.13, ``pathlib._local`` since (``pathlib`` re-exports
it), so a checkpoint written by either Python reads in the other."""


class UnsafePickle(pickle.UnpicklingError):
    """A pickle names a global outside ``ALLOWED`` (or sets the state of an object that is no DCP record);
    nothing of it was called. The message is one line naming the file."""


def _shown(text: str, limit: int = 120) -> str:
    """``text`` as one printable line: a crafted name may hold newlines or be megabytes long."""
    text = ascii(text)[1:-1]
    return text if len(text) <= limit else text[:limit] + "..."


class _Restricted(pickle._Unpickler):
    """The pure-Python unpickler: the C one applies ``BUILD`` to any object, with no hook to refuse it."""

    dispatch: ClassVar[dict] = dict(pickle._Unpickler.dispatch)

    def __init__(self, f: BinaryIO, name: str) -> None:
        super().__init__(f)
        self.name = name
        self.records: set[type] = set()  # the DCP dataclasses this pickle named: BUILD's only targets

    def refuse(self, what: str) -> UnsafePickle:
        return UnsafePickle(
            f"{self.name}: refused to load: it {what}, which a DCP .metadata never does (it holds only DCP's "
            f"metadata records, torch.Size, dtypes, a layout, a PosixPath and plain containers: "
            f"refexp/record/safe_pickle.py), so it was not written by torch.distributed.checkpoint and unpickling it "
            f"could run code; nothing of it was run")

    def find_class(self, module: str, name: str) -> Any:
        named = f"names {_shown(module)}.{_shown(name)}"
        if "." in name:  # protocol 4 would walk attributes from the module: anything it imports
            raise self.refuse(f"{named} (a dotted name)")
        if (module, name) in ALLOWED:
            home = "pathlib" if module in PATHLIB_HOMES else module  # pathlib re-exports PosixPath on every Python
            obj = vars(importlib.import_module(home)).get(name)
            if not (getattr(obj, "__qualname__", None) == name and isinstance(obj, type | FunctionType)
                    and (obj.__module__ == module or {module, obj.__module__} <= PATHLIB_HOMES)):
                found = f"{getattr(obj, '__module__', None)}.{getattr(obj, '__qualname__', type(obj).__name__)}"
                raise self.refuse(f"{named}, which is {_shown(found)} here, not the object of that name itself")
            if (module, name) in RECORDS:
                self.records.add(obj)
            return obj
        if module == "torch":
            import torch

            obj = vars(torch).get(name)  # torch's own namespace: no lazy import of a submodule by name
            if isinstance(obj, torch.dtype):
                return obj
        raise self.refuse(named)

    def load_build(self) -> None:
        target = self.stack[-2] if len(self.stack) >= 2 else None  # [..., target, state]
        if type(target) not in self.records:  # a class, a function or an enum member shared by the process
            kind = (f"the class {target.__module__}.{target.__qualname__}" if isinstance(target, type)
                    else f"a {type(target).__module__}.{type(target).__qualname__}")
            raise self.refuse(f"sets the state of {_shown(kind)}")
        pickle._Unpickler.load_build(self)

    dispatch[pickle.BUILD[0]] = load_build


def restricted_load(f: BinaryIO, *, name: str) -> Any:
    """``pickle.load(f)`` admitting only a DCP ``.metadata``'s globals; ``UnsafePickle`` (naming ``name``)
    for any other."""
    return _Restricted(f, name).load()


class UnsafeStorage(UnsafePickle):
    """A ``.metadata`` that unpickles to something other than DCP's ``Metadata``, or whose shard entry names a file
    outside its checkpoint dir or a negative or non-integer offset or length; no shard was read. The message is
    one line naming the file and the entry's path."""


PATH_LIMIT = 500
"""How much of a path a refusal shows: enough to name a real one, not a crafted megabyte."""


def _is(obj: Any, module: str, name: str) -> bool:
    """``obj`` is an instance of ``module``.``name`` (the unpickler builds only the classes that live there)."""
    return type(obj).__module__ == module and type(obj).__qualname__ == name


def _path_problem(rel: Any, root: Path) -> str | None:
    """Why ``rel`` (a ``_StorageInfo.relative_path``) is not a file inside ``root`` (resolved), or None."""
    if not isinstance(rel, str):
        return f"is a {type(rel).__name__}, not a file name"
    if not rel or "\0" in rel:
        return "is empty or holds a NUL"
    if os.path.isabs(rel):
        return "is an absolute path"
    if ".." in Path(rel).parts:
        return "has a '..' part"
    try:
        resolved = (root / rel).resolve()  # follows links: a shard linked to a file elsewhere is that file
    except (OSError, RuntimeError) as e:  # a link loop (RuntimeError before Python 3.13), a name too long
        return f"cannot be resolved ({type(e).__name__})"
    if resolved == root or not resolved.is_relative_to(root):
        inside = _shown(str(root), PATH_LIMIT)
        return f"resolves to {_shown(str(resolved), PATH_LIMIT)}, not a file inside {inside}"
    return None


def check_storage(metadata: Any, dcp_dir: str | os.PathLike, *, name: str) -> Any:
    """``metadata`` when it is DCP's ``Metadata`` and every shard entry (``storage_data``: ``MetadataIndex`` ->
    ``_StorageInfo``) names a file inside ``dcp_dir`` (no absolute path, no ``..`` part, no link out of it) at a
    non-negative int offset and length, as torch's writer writes them; else ``UnsafeStorage`` naming ``name``.

    torch's ``FileSystemReader`` opens ``dcp_dir / relative_path`` as it finds it, so a ``.metadata`` of DCP's own
    records (which the unpickler admits) could otherwise read any file the run can read into the weights."""
    def refuse(what: str) -> UnsafeStorage:
        return UnsafeStorage(
            f"{name}: refused to load: {what}; torch.distributed.checkpoint writes each shard as a file name inside "
            f"the checkpoint dir at a non-negative offset and length, so this .metadata could read another file's "
            f"bytes into the weights; no shard was read")

    if not _is(metadata, METADATA_MODULE, "Metadata"):
        raise refuse(f"it holds a {_shown(type(metadata).__qualname__)}, not a DCP Metadata")
    if not isinstance(storage := getattr(metadata, "storage_data", None), dict):
        raise refuse(f"its storage_data is a {_shown(type(storage).__qualname__)}, not a dict of shard entries")
    root = Path(dcp_dir).resolve()
    checked: set[str] = set()  # a model's many entries share a few files: resolve each once
    for info in storage.values():
        if not _is(info, FILESYSTEM_MODULE, "_StorageInfo"):
            raise refuse(f"a shard entry is a {_shown(type(info).__qualname__)}, not a _StorageInfo")
        rel = vars(info).get("relative_path")
        if not (isinstance(rel, str) and rel in checked):
            if (problem := _path_problem(rel, root)) is not None:
                raise refuse(f"a shard entry's relative_path {_shown(repr(rel), PATH_LIMIT)} {problem}")
            checked.add(rel)
        for field in ("offset", "length"):
            value = vars(info).get(field)
            if type(value) is not int or value < 0:  # bool is an int subclass: refused too
                shown = _shown(repr(rel), PATH_LIMIT)
                raise refuse(f"the shard entry of {shown} has {field} {_shown(repr(value))}, not a non-negative int")
    return metadata


def read_dcp_metadata(dcp_dir: str | os.PathLike) -> Any:
    """The ``Metadata`` of the DCP checkpoint in ``dcp_dir`` (its ``.metadata``), read by
    ``restricted_load`` and ``check_storage``: ``UnsafePickle`` for a crafted file (a global it may not name, a
    shard outside the dir), the usual ``OSError``/``EOFError``/``UnpicklingError`` for a missing or damaged one."""
    path = Path(dcp_dir) / ".metadata"
    with open(path, "rb") as f:
        return check_storage(restricted_load(f, name=str(path)), dcp_dir, name=str(path))
