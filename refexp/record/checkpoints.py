"""A checkpoint's manifest: every file of a ``step-N`` dir with its size and sha256, written last.

DCP's ``.metadata`` says that a save finished; it says nothing of what happened to the files since (a
truncated copy, bytes overwritten in place). ``refexp-manifest.json`` is written once every rank's files
are on disk (rank 0, after a barrier: ``Checkpointer.save``), atomically (a temporary name, fsync,
rename), so a dir whose manifest is there and matches holds exactly what was saved.

Checksums are hashlib's sha256: the standard library (xxhash would be ~8x faster, but it is only a
transitive dependency, of ``datasets``), ~1.2 GB/s per core, the files of
a dir hashed in parallel threads (hashlib releases the GIL). ``checkpoint.verify=size`` skips them
(sizes only) where that time matters more than a same-size corruption.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from refexp.record.safe_pickle import UnsafePickle, read_dcp_metadata

MANIFEST = "refexp-manifest.json"
"""The manifest's file name inside a ``step-N`` dir."""
FORMAT = 1


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _files(step_dir: Path) -> list[Path]:
    """Every file under ``step_dir`` but the manifest and its temporary, sorted."""
    return sorted(p for p in step_dir.rglob("*") if p.is_file() and not p.name.startswith(MANIFEST))


def checksums_of(paths: list[Path]) -> list[str]:
    """The sha256 of each file, hashed in parallel threads."""
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1, max(1, len(paths)))) as pool:
        return list(pool.map(_sha256, paths))


def write_manifest(step_dir: str | os.PathLike, *, checksums: bool, run: dict | None = None) -> None:
    """List every file of ``step_dir`` (relative path, size, and sha256 when ``checksums``) in its
    manifest (``publish_manifest``: a reader sees all of it or none). ``run``: the identity of the run that
    wrote it (``refexp/components/run_identity.py``), kept as ``run``."""
    step_dir = Path(step_dir)
    paths = _files(step_dir)
    sums = checksums_of(paths) if checksums else [None] * len(paths)
    files = {}
    for p, digest in zip(paths, sums):
        entry = {"size": p.stat().st_size}
        if digest is not None:
            entry["sha256"] = digest
        files[p.relative_to(step_dir).as_posix()] = entry
    publish_manifest(step_dir, files, run=run)


def publish_manifest(step_dir: Path, files: dict, *, name: str = MANIFEST, run: dict | None = None) -> None:
    """Write ``{"format", "files"}`` (and ``run`` when given) as ``step_dir/name`` through a temporary name,
    fsynced and renamed."""
    tmp = step_dir / f"{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # two writers may seal one cache entry
    with open(tmp, "w") as f:
        json.dump({"format": FORMAT, "files": files, **({"run": run} if run is not None else {})}, f, indent=1,
                  sort_keys=True, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, step_dir / name)
    dir_fd = os.open(step_dir, os.O_RDONLY)  # the rename itself survives a crash once the dir is synced
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def manifest_run(step_dir: str | os.PathLike) -> dict | None:
    """The run identity ``step_dir``'s manifest records (None: no manifest, or one written before identities)."""
    try:
        run = json.loads((Path(step_dir) / MANIFEST).read_text()).get("run")
    except (OSError, ValueError, AttributeError):
        return None
    return run if isinstance(run, dict) else None


def has_manifest(step_dir: str | os.PathLike) -> bool:
    return (Path(step_dir) / MANIFEST).is_file()


def manifest_mismatch(step_dir: str | os.PathLike, *, checksums: bool, name: str = MANIFEST) -> str | None:
    """None when every file the manifest lists has its size (and, with ``checksums`` and a manifest
    that records them, its sha256); else what is wrong, naming the first bad file. Files the manifest
    does not list are ignored (DCP reads only those ``.metadata`` names, and it is listed)."""
    step_dir = Path(step_dir)
    try:
        files = json.loads((step_dir / name).read_text())["files"]
    except FileNotFoundError:
        return f"no {name}"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{name} is unreadable ({type(e).__name__}: {e})"
    to_hash = []
    for rel, entry in sorted(files.items()):
        p = step_dir / rel
        if not p.is_file():
            return f"{rel} is missing"
        if (size := p.stat().st_size) != entry["size"]:
            return f"{rel} has {size} bytes, the manifest {entry['size']}"
        if checksums and "sha256" in entry:
            to_hash.append((rel, p, entry["sha256"]))
    for (rel, _, want), got in zip(to_hash, checksums_of([p for _, p, _ in to_hash])):
        if got != want:
            return f"{rel} does not match its sha256 in the manifest (same size: overwritten in place)"
    return None


def dcp_structure_mismatch(step_dir: str | os.PathLike) -> str | None:
    """For a dir without a manifest: None when DCP's ``.metadata`` reads and every byte range it
    references lies inside an existing file (a truncation shows; an overwrite in place does not).
    ``.metadata`` is read by the restricted unpickler (``record/safe_pickle.py``): a crafted one is refused
    (a problem), not run."""
    step_dir = Path(step_dir)
    try:
        storage = read_dcp_metadata(step_dir).storage_data
    except UnsafePickle as e:
        return str(e)
    except Exception as e:  # a truncated or garbled pickle raises anything from EOFError to UnpicklingError
        return f".metadata is unreadable ({type(e).__name__}: {e})"
    sizes: dict[str, int] = {}
    for info in storage.values():
        rel = info.relative_path
        if rel not in sizes:
            p = step_dir / rel
            sizes[rel] = p.stat().st_size if p.is_file() else -1
        if sizes[rel] < 0:
            return f"{rel} is missing"
        if sizes[rel] < info.offset + info.length:
            return f"{rel} has {sizes[rel]} bytes, .metadata needs {info.offset + info.length}"
    return None


def complete_steps(folder: str | os.PathLike) -> list[int]:
    """The N of every ``step-N`` dir under ``folder`` whose DCP ``.metadata`` was written, ascending."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir()
                  if (m := re.fullmatch(r"step-(\d+)", p.name)) and (p / ".metadata").is_file())


def step_problem(step_dir: str | os.PathLike, *, checksums: bool, first_manifested: int | None) -> str | None:
    """None when ``step_dir`` (a complete ``step-N``) can be loaded, else why not.

    With a manifest: ``manifest_mismatch``. Without one it is a save stopped between ``.metadata`` and
    its manifest when a lower step of the folder has a manifest (``first_manifested``); else a
    checkpoint written before refexp wrote manifests, accepted with a warning when its ``.metadata``
    reads and every file is as long as it says (``dcp_structure_mismatch``).
    """
    step_dir = Path(step_dir)
    if has_manifest(step_dir):
        return manifest_mismatch(step_dir, checksums=checksums)
    step = int(step_dir.name.split("-")[1])
    if first_manifested is not None and step > first_manifested:
        return f"no {MANIFEST} (a save stopped before its manifest was written)"
    problem = dcp_structure_mismatch(step_dir)
    if problem is None:
        warnings.warn(f"[refexp] checkpoint {step_dir} is unverified (no manifest: written before manifests); "
                      f"using it", stacklevel=2)
    return problem


def checked_steps(folder: str | os.PathLike, *, checksums: bool) -> Iterator[tuple[int, str | None]]:
    """``(step, problem)`` for each complete step of ``folder``, newest first (``step_problem``: None
    when it can be loaded); a warning names each bad one (its dir and the first file that does not match)."""
    folder = Path(folder)
    steps = complete_steps(folder)
    first_manifested = next((s for s in steps if has_manifest(folder / f"step-{s}")), None)
    for step in reversed(steps):
        problem = step_problem(folder / f"step-{step}", checksums=checksums, first_manifested=first_manifested)
        if problem is not None:
            warnings.warn(f"[refexp] skipping checkpoint {folder / f'step-{step}'}: {problem}", stacklevel=2)
        yield step, problem


def newest_verified_step(folder: str | os.PathLike, *, checksums: bool = True) -> int:
    """The newest step of ``folder`` that ``checked_steps`` passes (-1 if none)."""
    return next((step for step, problem in checked_steps(folder, checksums=checksums) if problem is None), -1)
