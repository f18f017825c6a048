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


def _git_commit(repo: Path) -> str | None:
    """The checkout's commit, with ``-dirty`` when tracked files differ from it; None outside a git checkout."""
    try:
        sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


@lru_cache(maxsize=1)
def provenance() -> dict:
    """``{"commit": "abc123…" | None, "python": "3.11.7", "versions": {package: version}}``."""
    return {"commit": _git_commit(Path(__file__).resolve().parent.parent), "python": platform.python_version(),
            "versions": {p: v for p in PACKAGES if (v := _version(p)) is not None}}
