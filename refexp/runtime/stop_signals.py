"""Stop signals in every phase of a run, so that ``status.json`` never stays ``running`` after one.

``installed()`` (``refexp/run.py``, as soon as the run dir is known, in every process of a run) makes
SIGTERM/SIGUSR2 raise ``Preempted`` and SIGINT raise ``KeyboardInterrupt`` wherever the process is
(start-up, the SFT stage, an evaluation, a save): ``run_worker`` records ``preempted`` or ``failed``. The
training loop defers them to the end of a step instead, saves, then raises ``Preempted``
(``refexp/algos/loop.py``). A handler found installed before refexp's (submitit's, which requeues the
job) is called first (``foreign``).
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)
"""SIGTERM: torchrun's and SLURM's stop; SIGUSR2: submitit's warning before a preemption or time limit."""


class Preempted(SystemExit):
    """A stop signal ended the run (in the training loop: after the checkpoint of its step was written)."""


class _RaiseOnStop:
    """The handler ``installed`` sets: call the handler it replaced (when it is a function), then raise."""

    def __init__(self, previous) -> None:
        self.previous = previous

    def __call__(self, signum, frame) -> None:
        if callable(self.previous):
            self.previous(signum, frame)
        name = signal.Signals(signum).name
        if signum == signal.SIGINT:
            raise KeyboardInterrupt(f"interrupted ({name}) before the run finished")
        raise Preempted(f"stop signal {name} received outside a training step (nothing saved by this "
                        f"invocation since its last checkpoint); rerun the same run dir to resume")


@contextmanager
def installed() -> Iterator[None]:
    """Within the block, SIGTERM/SIGUSR2 raise ``Preempted`` and SIGINT ``KeyboardInterrupt`` in this process;
    the handlers found are put back after it. Nested blocks change nothing; off the main thread (where
    Python cannot set handlers) neither does this."""
    replaced = {}
    if threading.current_thread() is threading.main_thread():
        for s in (*PREEMPT_SIGNALS, signal.SIGINT):
            current = signal.getsignal(s)
            if current is not signal.SIG_IGN and not isinstance(current, _RaiseOnStop):  # ignored (nohup) stays so
                previous = None if current is signal.default_int_handler else current
                replaced[s] = signal.signal(s, _RaiseOnStop(previous))
    try:
        yield
    finally:
        for s, handler in replaced.items():
            signal.signal(s, handler)


def foreign(handler):
    """The handler to chain to from ``handler``: the one ``installed`` replaced, or ``handler`` itself."""
    return handler.previous if isinstance(handler, _RaiseOnStop) else handler
