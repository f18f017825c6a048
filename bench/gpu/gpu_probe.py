"""The frame of bench/gpu/gpu_check.py's probes: gpu_smoke's options, device choice, ``Bench`` and ``Runner`` (one JSON
line per figure, errors and the time budget per figure, a watchdog), for figures gpu_smoke.py does not have."""

from __future__ import annotations

from typing import Callable

import _common as C
import gpu_smoke
import torch


def run_probe(figures: tuple[str, ...], run_figures: Callable[[gpu_smoke.Runner, gpu_smoke.Bench], None],
              argv=None) -> dict:
    """Parse gpu_smoke's options, then ``run_figures(runner, bench)``; returns the ok/error/skipped counts."""
    args = gpu_smoke.parse_args(argv)
    if args.threads:
        C.set_threads(args.threads)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if (args.device == "cuda" or (args.device == "auto" and cuda)) else "cpu")
    runner = gpu_smoke.Runner(args.budget_s, device, figures=figures)
    try:
        if args.device == "cuda" and not cuda:
            for name in figures:
                runner.run(name, lambda: (_ for _ in ()).throw(RuntimeError("--device cuda but no CUDA device")))
        else:
            run_figures(runner, gpu_smoke.Bench(args, device))
    finally:
        runner.summary()
    return runner.counts
