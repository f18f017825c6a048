"""What produced a run: the refexp commit and the versions of the libraries that decide its numbers.

Recorded in ``status.json`` at the start of every run, and shown in the report's setup block, so a
committed report says which code made it.
"""

from __future__ import annotations

import platform
import subprocess
from functools import lru_cache
from importlib import metadata
from pathlib import Path

PACKAGES = ("refexp", "torch", "torchtitan", "transformers", "datasets")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


GIT_TIMEOUT_S = 10


def git(repo: Path, *args: str) -> subprocess.CompletedProcess | None:
    """``git -C repo args``, its output captured as text; None where git is missing or does not answer in
    ``GIT_TIMEOUT_S``."""
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None


def _git_commit(repo: Path) -> str | None:
    """The checkout's commit, with ``-dirty`` when tracked files differ from it; None outside a git checkout."""
    sha = git(repo, "rev-parse", "--short=12", "HEAD")
    if sha is None or sha.returncode != 0:
        return None
    dirty = git(repo, "status", "--porcelain", "--untracked-files=no")
    return sha.stdout.strip() + ("-dirty" if dirty is not None and dirty.stdout.strip() else "")


@lru_cache(maxsize=1)
def provenance() -> dict:
    """``{"commit": "abc123…" | None, "python": "3.11.7", "versions": {package: version}}``."""
    return {"commit": _git_commit(Path(__file__).resolve().parent.parent), "python": platform.python_version(),
            "versions": {p: v for p in PACKAGES if (v := _version(p)) is not None}}
