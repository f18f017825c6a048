"""Cache entries: when one holds a finished result (its marker file, written last, exists), and whether it
still holds what was written (its manifest).

An entry (the SFT model, the reward model, the DPO pairs, generated task data: a dir; DPO's reference
log-probs: one file) is written with a manifest of every file's size and sha256, in the checkpoints' format
(``refexp/record/checkpoints.py``): a dir's ``refexp-manifest.json`` is written into its temporary dir last,
before the rename that publishes it (``record.atomic.atomic_dir(..., manifest=True)``); a file's is
``<file>.refexp-manifest.json`` beside it, written after it. ``verified_entry`` checks it before the entry is
read: a corrupt entry (bit flips, a truncation, a file missing) is ``CorruptCacheEntry``, one line naming the
entry and its first bad file, and is not read. An entry written before refexp wrote manifests is used with a
warning naming its content digest, and sealed with a manifest of what it holds now (so a later change shows);
it is never rebuilt, which would swap a run's start under it.

``entry_digest`` is an entry's content identity: the sha256 of its files' names and sha256s, the same whether
read from its manifest or hashed. A manifest guards against corruption, not against someone who can write the
cache: a shared ``REFEXP_CACHE`` is trusted by everyone who shares it (docs/runs.md, "The cache").

Torch-free.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Callable

from refexp.record.checkpoints import MANIFEST, checksums_of, manifest_mismatch, publish_manifest


class CorruptCacheEntry(ValueError):
    """A cache entry does not match its manifest (or its manifest is unreadable); the message is one line
    naming the entry, its first bad file and what to do."""


def marker_check(marker: str) -> Callable[[Path], bool]:
    """``is_complete(out)``: whether cache dir ``out`` holds a finished result, i.e. ``out / marker`` (the
    result's last write) is a file."""

    def is_complete(out: Path) -> bool:
        return (Path(out) / marker).is_file()

    return is_complete


def manifest_path(entry: str | os.PathLike) -> Path:
    """Where ``entry``'s manifest is: inside a dir, beside a file."""
    entry = Path(entry)
    return entry / MANIFEST if entry.is_dir() else entry.with_name(f"{entry.name}.{MANIFEST}")


def write_entry_manifest(entry: str | os.PathLike) -> None:
    """Seal ``entry`` (a finished dir or file) with a manifest of its files' sizes and sha256s (atomic)."""
    _publish(Path(entry), _hashed_files(Path(entry)))


def _publish(entry: Path, files: dict) -> None:
    publish_manifest(entry if entry.is_dir() else entry.parent, files, name=manifest_path(entry).name)


def _manifest_files(entry: Path) -> dict:
    return json.loads(manifest_path(entry).read_text())["files"]


def _digest(files: dict) -> str:
    """The sha256 of ``{name: sha256}`` as sorted JSON."""
    listing = {rel: e.get("sha256") for rel, e in sorted(files.items())}
    return hashlib.sha256(json.dumps(listing, sort_keys=True).encode()).hexdigest()


def _hashed_files(entry: Path) -> dict:
    """``{name: {"size", "sha256"}}`` of ``entry``'s files as they are now (its manifest left out)."""
    if entry.is_dir():
        paths = sorted(p for p in entry.rglob("*") if p.is_file() and not p.name.startswith(MANIFEST)
                       and not _datasets_cache_file(p))
        names = [p.relative_to(entry).as_posix() for p in paths]
    else:
        paths, names = [entry], [entry.name]
    return {n: {"size": p.stat().st_size, "sha256": s} for n, p, s in zip(names, paths, checksums_of(paths))}


def _datasets_cache_file(p: Path) -> bool:
    """A ``cache-<fingerprint>.arrow`` that ``datasets`` writes beside a dataset loaded from disk when it is
    mapped or filtered: made by readers after the entry was written, not part of it."""
    return p.name.startswith("cache-") and p.suffix == ".arrow"


def entry_digest(entry: str | os.PathLike) -> str:
    """``entry``'s content digest: from its manifest (after ``verified_entry``), else from hashing its files."""
    entry = Path(entry)
    try:
        return _digest(_manifest_files(entry))
    except (OSError, ValueError, KeyError, TypeError):
        return _digest(_hashed_files(entry))


def verified_entry(entry: str | os.PathLike, what: str) -> str:
    """``entry``'s content digest once it matches its manifest; ``CorruptCacheEntry`` when it does not. An entry
    without a manifest (written before manifests) is used: a warning names its digest, and it is sealed with a
    manifest of what it holds now (best effort: a read-only shared cache stays unsealed). ``what`` names the
    kind of entry in messages ("SFT model", "reward model", ...)."""
    entry = Path(entry)
    if manifest_path(entry).is_file():
        root = entry if entry.is_dir() else entry.parent
        problem = manifest_mismatch(root, checksums=True, name=manifest_path(entry).name)
        if problem is not None:
            raise CorruptCacheEntry(
                f"the {what} cache entry {entry} is corrupt ({problem}) and was not read: delete it to rebuild "
                f"it (in a shared cache, tell whoever else uses it)")
        return entry_digest(entry)
    files = _hashed_files(entry)
    digest = _digest(files)
    warnings.warn(f"[refexp] the {what} cache entry {entry} has no manifest (written before manifests): using it "
                  f"unverified, content sha256 {digest}", stacklevel=2)
    try:
        _publish(entry, files)
    except OSError:
        pass
    return digest
