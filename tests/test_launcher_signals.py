"""``spawn_workers`` (refexp/runtime/launcher.py) runs torch's elastic agent in the calling process, which sets
its own SIGINT/SIGTERM handlers there (raising its ``SignalException``) and leaves them set. The launcher puts
back the handlers it found, so a Ctrl-C after a multi-process job is what it was before: a ``KeyboardInterrupt``
(or the caller's own handler), which refexp/runtime/stop_signals.py turns into a ``failed`` status."""

from __future__ import annotations

import signal

from omegaconf import OmegaConf

from refexp.runtime.launcher import spawn_workers
from tests.helpers.trivial_worker import rank_of


def test_a_multi_process_launch_leaves_this_processs_signal_handlers_as_it_found_them():
    def mine(signum, frame):
        raise KeyboardInterrupt("the caller's own handler")

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, mine)
    try:
        assert spawn_workers(rank_of, OmegaConf.create({"x": 1}), 2) == {"rank": 0}
        assert signal.getsignal(signal.SIGINT) is mine
        assert signal.getsignal(signal.SIGTERM) is before[signal.SIGTERM]
    finally:
        for s, h in before.items():
            signal.signal(s, h)
