"""A tqdm progress bar on rank 0 (a no-op object elsewhere, or when disabled)."""

from __future__ import annotations

import sys


class _NoBar:
    def update(self, n: int = 1) -> None: ...
    def set_postfix(self, **kw) -> None: ...
    def close(self) -> None: ...


def progress_bar(*, total: int, desc: str, enabled: bool = True, initial: int = 0):
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, initial=initial, dynamic_ncols=True, leave=False, file=sys.stderr,
                mininterval=1.0)
