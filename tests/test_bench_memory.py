"""bench/memory.py runs end to end at a minimal size (in this process) and prints its documented lines;
the figures themselves are bench/README.md's ("Memory: activation checkpointing and micro-batching")."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.numerics  # tests/README.md: run under other CPU kernels too

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


def test_memory_bench_prints_one_line_per_configuration_and_a_summary(capsys):
    import memory

    rows = memory.main(["--dim", "32", "--layers", "2", "--heads", "2", "--ffn", "64", "--vocab", "64", "--rows", "4",
                        "--seq", "16", "--micro", "2", "--threads", "1", "--in-process"])
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert [r["config"] for r in rows] == list(memory.CONFIGS) and len(lines) == len(rows) + 1
    assert set(lines[-1]["summary"]) == set(memory.CONFIGS)
    # every configuration computes the same update
    assert max(r["loss"] for r in rows) - min(r["loss"] for r in rows) < 1e-5
    assert max(r["grad_norm"] for r in rows) - min(r["grad_norm"] for r in rows) < 1e-5
    assert all(r["peak_update_mb"] >= 0 for r in rows)
