"""Preflight of bench/gpu/gpu_check.py (~15 s): what the machine is and whether the paths the other steps take work,
one JSON line per figure (gpu_smoke's ``Runner``: a failure is that figure's error, the others still run).

``preflight_versions``
    Value: how many of ``PACKAGES`` import. Fields: their versions, torch's CUDA, cuDNN and NCCL, the driver and
    the GPU's SM / memory clocks now (``nvidia-smi``; bench/gpu/gpu_check.py reads them again at the end).
``preflight_refexp_tasks``
    ``import refexp.tasks`` (the tasks' datasets, pyarrow and fsspec against the machine's versions). Value 1.
``preflight_collectives``
    A 1-rank process group (NCCL on CUDA, gloo on CPU): an all-reduce and an all-gather, checked. Value: their
    seconds. On failure gpu_check.py runs the later steps in float32 (no FSDP mixed precision, no process
    group) and says so.
``preflight_deterministic_cumsum``
    ``torch.cumsum`` in float64 under ``torch.use_deterministic_algorithms(True)`` on the device
    (``training.deterministic=true``). Value 1; the error says what a deterministic run would hit.

    python bench/gpu/gpu_preflight.py [--toy] [--budget-s N] [gpu_smoke.py's other options]
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # bench/gpu/ (these modules) and bench/ (_common.py)

import torch  # noqa: E402
from gpu_check import gpu_clocks  # noqa: E402
from gpu_probe import run_probe  # noqa: E402

FIGURES = ("preflight_versions", "preflight_refexp_tasks", "preflight_collectives", "preflight_deterministic_cumsum")
PACKAGES = ("triton", "numpy", "pyarrow", "pandas", "fsspec", "datasets", "transformers", "torchtitan")


def fig_versions() -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = getattr(importlib.import_module(name), "__version__", "unknown")
        except Exception as e:  # noqa: BLE001 - any import failure is the finding
            versions[name] = f"missing: {type(e).__name__}: {e}"[:200]
    cuda = torch.cuda.is_available()
    return {"value": sum(not str(v).startswith("missing") for v in versions.values()), "unit": "packages",
            "of": len(PACKAGES), "versions": versions, "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if cuda else None,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None, "gpu": gpu_clocks()}


def fig_tasks() -> dict:
    import refexp.tasks  # noqa: F401

    return {"value": 1, "unit": "ok"}


def fig_collectives(device: torch.device) -> dict:
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        dist.init_process_group(backend, init_method=f"file://{d}/store", rank=0, world_size=1)
        try:
            x = torch.arange(1024, dtype=torch.float32, device=device)
            dist.all_reduce(x)
            gathered = torch.empty(1024, dtype=torch.float32, device=device)
            (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(gathered, x)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if not torch.equal(gathered.cpu(), torch.arange(1024, dtype=torch.float32)):
                raise RuntimeError("all_gather of one rank did not return its input")
        finally:
            dist.destroy_process_group()
    return {"value": round(time.perf_counter() - t0, 3), "unit": "s", "backend": backend,
            "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}}


def fig_cumsum(device: torch.device) -> dict:
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        x = torch.rand(4, 4096, dtype=torch.float64, device=device)
        got = torch.cumsum(x, dim=-1)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    finally:
        torch.use_deterministic_algorithms(was)
    return {"value": 1, "unit": "ok", "max_abs_vs_cpu": float((got.cpu() - torch.cumsum(x.cpu(), -1)).abs().max())}


def main(argv=None) -> dict:
    def figures(runner, bench):
        runner.run("preflight_versions", fig_versions)
        runner.run("preflight_refexp_tasks", fig_tasks)
        runner.run("preflight_collectives", lambda: fig_collectives(bench.device))
        runner.run("preflight_deterministic_cumsum", lambda: fig_cumsum(bench.device))

    return run_probe(FIGURES, figures, argv)


if __name__ == "__main__":
    main()
