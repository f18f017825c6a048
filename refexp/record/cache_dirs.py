"""Cache entries: when one holds a finished result (its marker file, written last, exists), and whether it
still holds what was written (its manifest).

An entry (the SFT model, the reward model, the DPO pairs, generated task data: a dir; DPO's reference
log-probs: one file) is written with a manifest of every file's size and sha256, in the checkpoints' format
(``refexp/record/checkpoints.py``): a dir's ``refexp-manifest.json`` is written into its temporary dir last,
before the rename that publishes it (``record.atomic.atomic_dir(..., manifest=True)``); a file's is
``<file>.refexp-manifest.json`` beside it, written after it. ``verified_entry`` checks it before the entry is
read: a corrupt entry (bit flips, a truncation, a file missing, a file its manifest does not list: a loader
reads what is in the dir, e.g. ``config.json`` and ``*.safetensors`` beside an SFT model's ``model/``) is
``CorruptCacheEntry``, one line naming the entry and its first bad file, and is not read. So is an entry without
a manifest: every kind of entry is written with one, and every kind's key but generated task data's changed
after manifests came (that data is deterministic: rebuilding it changes nothing), so a missing manifest was
deleted or lost; the files it would have checked are not trusted, nor sealed as they are (which would seal any
damage with them).

``entry_digest`` is an entry's content identity: the sha256 of its files' names and sha256s, the same whether
read from its manifest or hashed. A manifest guards against corruption, not against someone who can write the
cache: a shared ``REFEXP_CACHE`` is trusted by everyone who shares it (docs/runs.md, "The cache").

Torch-free.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Callable, NoReturn

from refexp.record.checkpoints import MANIFEST, checksums_of, manifest_mismatch, publish_manifest


class CorruptCacheEntry(ValueError):
    """A cache entry does not match its manifest (or its manifest is missing or unreadable); the message is one
    line naming the entry, its first bad file and what to do."""


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


def _entry_files(entry: Path) -> list[Path]:
    """The files of dir ``entry`` that are part of it, sorted: all but its manifest (and a sealer's temporary of
    it) and the files readers of a dataset write into it."""
    return sorted(p for p in entry.rglob("*") if p.is_file() and not p.name.startswith(MANIFEST)
                  and not _datasets_reader_file(p))


def _hashed_files(entry: Path) -> dict:
    """``{name: {"size", "sha256"}}`` of ``entry``'s files as they are now (its manifest left out)."""
    if entry.is_dir():
        paths = _entry_files(entry)
        names = [p.relative_to(entry).as_posix() for p in paths]
    else:
        paths, names = [entry], [entry.name]
    return {n: {"size": p.stat().st_size, "sha256": s} for n, p, s in zip(names, paths, checksums_of(paths))}


_TEMPFILE_NAME = re.compile(r"tmp[a-z0-9_]{8}")
"""``tempfile.NamedTemporaryFile``'s default name: ``datasets`` maps into one before renaming it to its cache file."""


def _datasets_reader_file(p: Path) -> bool:
    """A ``cache-<fingerprint>.arrow`` that ``datasets`` writes beside a dataset loaded from disk when it is
    mapped or filtered, or the temporary it writes it through: made by readers after the entry was written, not
    part of it (and no loader of weights reads either name)."""
    return (p.name.startswith("cache-") and p.suffix == ".arrow") or _TEMPFILE_NAME.fullmatch(p.name) is not None


def entry_digest(entry: str | os.PathLike) -> str:
    """``entry``'s content digest: from its manifest (after ``verified_entry``), else from hashing its files."""
    entry = Path(entry)
    try:
        return _digest(_manifest_files(entry))
    except (OSError, ValueError, KeyError, TypeError):
        return _digest(_hashed_files(entry))


def verified_entry(entry: str | os.PathLike, what: str) -> str:
    """``entry``'s content digest once it holds exactly what its manifest lists; else ``CorruptCacheEntry`` (one
    line naming the entry and its first bad file): a file changed or missing, a file added (a loader would read
    it: ``config.json`` and ``model.safetensors`` beside the SFT model's ``model/`` make it an HF dir), or no
    manifest at all. ``what`` names the kind of entry in messages ("SFT model", "reward model", ...)."""
    entry = Path(entry)
    if not manifest_path(entry).is_file():
        _refuse(entry, what, f"no {manifest_path(entry).name}: deleted or lost, so what it holds cannot be verified")
    root = entry if entry.is_dir() else entry.parent
    problem = manifest_mismatch(root, checksums=True, name=manifest_path(entry).name)
    if problem is None and entry.is_dir():
        problem = _unlisted(entry)
    if problem is not None:
        _refuse(entry, what, problem)
    return entry_digest(entry)


def _unlisted(entry: Path) -> str | None:
    """None when every file of dir ``entry`` is in its manifest; else what is not."""
    try:
        listed = set(_manifest_files(entry))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # manifest_mismatch has already named an unreadable manifest
    extra = [p.relative_to(entry).as_posix() for p in _entry_files(entry)]
    extra = [rel for rel in extra if rel not in listed]
    if not extra:
        return None
    more = f" and {len(extra) - 3} more" if len(extra) > 3 else ""
    return f"{', '.join(extra[:3])}{more} not in its manifest: added since it was written"


def _refuse(entry: Path, what: str, problem: str) -> NoReturn:
    raise CorruptCacheEntry(f"the {what} cache entry {entry} is corrupt ({problem}) and was not read: delete it to "
                            f"rebuild it (in a shared cache, tell whoever else uses it)")
