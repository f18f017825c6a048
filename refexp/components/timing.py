"""Wall-clock timers that mean what they say on a GPU.

CUDA kernels run asynchronously: ``time.perf_counter()`` around a forward measures the kernel launches,
not the work. ``now(device)`` first waits for the device's queued work, so the difference of two calls
is the time the work between them took. On CPU it is ``time.perf_counter()``.
"""

from __future__ import annotations

import time

import torch


def now(device: torch.device | str | None = None) -> float:
    """Seconds (``time.perf_counter``), after the work queued on ``device`` has finished."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
