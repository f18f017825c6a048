"""When a cache directory holds a finished result: its marker file, written last, exists.

Torch-free; ``record.atomic.atomic_dir(out, is_complete=...)`` and the caches of the SFT model, the preference pairs and
the generated task data ask it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable


def marker_check(marker: str) -> Callable[[Path], bool]:
    """``is_complete(out)``: whether cache dir ``out`` holds a finished result, i.e. ``out / marker`` (the
    result's last write) is a file."""

    def is_complete(out: Path) -> bool:
        return (Path(out) / marker).is_file()

    return is_complete
