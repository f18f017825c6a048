"""Progress without a terminal: periodic plain lines, no carriage-return redraws."""

from __future__ import annotations

import io

from refexp.components.progress import LogLines, progress_bar


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_log_lines_print_at_most_one_line_per_interval_and_a_last_one():
    out, clock = io.StringIO(), FakeClock()
    bar = LogLines(total=100, desc="grpo", every_s=30.0, stream=out, clock=clock)
    for _ in range(100):
        clock.t += 1.0  # 1 s per step: a line every 30 steps
        bar.update(1)
        bar.set_postfix(reward="0.50")
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines == ["[refexp] grpo 30/100 (30%) 1.00 s/step reward=0.50",
                     "[refexp] grpo 60/100 (60%) 1.00 s/step reward=0.50",
                     "[refexp] grpo 90/100 (90%) 1.00 s/step reward=0.50",
                     "[refexp] grpo 100/100 (100%) 1.00 s/step reward=0.50"]
    assert "\r" not in out.getvalue()


def test_a_resumed_run_counts_its_rate_from_where_it_resumed():
    out, clock = io.StringIO(), FakeClock()
    bar = LogLines(total=10, desc="dpo", initial=6, every_s=100.0, stream=out, clock=clock)
    for _ in range(4):
        clock.t += 2.0
        bar.update(1)
    bar.close()
    assert out.getvalue() == "[refexp] dpo 10/10 (100%) 2.00 s/step\n"


def test_without_a_terminal_the_bar_is_log_lines(monkeypatch):
    import sys

    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a TTY, as under SLURM or with 2>log
    assert isinstance(progress_bar(total=5, desc="x"), LogLines)
