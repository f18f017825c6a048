"""Progress on rank 0: a tqdm bar on a terminal, periodic log lines otherwise, nothing when disabled.

A bar redraws itself with carriage returns; written into a file (SLURM's output, a redirected log) that
is thousands of overwritten lines. When stderr is not a terminal, ``LogLines`` prints one plain line
every ``every_s`` seconds (and at the end) instead.
"""

from __future__ import annotations

import sys
import time


class _NoBar:
    def update(self, n: int = 1) -> None: ...
    def set_postfix(self, **kw) -> None: ...
    def close(self) -> None: ...


class LogLines:
    """``[refexp] grpo 40/200 (20%) 1.3 s/step reward=0.52``, at most one line per ``every_s`` seconds."""

    def __init__(self, *, total: int, desc: str, initial: int = 0, every_s: float = 30.0, stream=None,
                 clock=time.monotonic):
        self.total, self.desc, self.n, self.every_s = total, desc, initial, every_s
        self.stream = stream or sys.stderr
        self.clock = clock
        self._start_n, self._start_t = initial, clock()
        self._last_print = self._start_t
        self._postfix: dict = {}

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self.clock()
        if now - self._last_print >= self.every_s:
            self._print(now)

    def set_postfix(self, **kw) -> None:
        self._postfix = kw

    def _print(self, now: float) -> None:
        done = self.n - self._start_n
        rate = f" {(now - self._start_t) / done:.2f} s/step" if done else ""
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        post = "".join(f" {k}={v}" for k, v in self._postfix.items())
        print(f"[refexp] {self.desc} {self.n}/{self.total}{pct}{rate}{post}", file=self.stream, flush=True)
        self._last_print = now

    def close(self) -> None:
        if self.n > self._start_n:
            self._print(self.clock())


def progress_bar(*, total: int, desc: str, enabled: bool = True, initial: int = 0):
    if not enabled:
        return _NoBar()
    if not sys.stderr.isatty():
        return LogLines(total=total, desc=desc, initial=initial)
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, initial=initial, dynamic_ncols=True, leave=False, file=sys.stderr,
                mininterval=1.0)
