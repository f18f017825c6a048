"""The process-wide torch settings a run's ``training`` block asks for: intra-op threads and deterministic
algorithms (``training.num_threads``, ``training.deterministic``; docs/gpus.md, "What holds on a GPU").

``run_worker`` applies them first, before the device is resolved or anything runs on it: cuBLAS reads
``CUBLAS_WORKSPACE_CONFIG`` when a process first uses it.
"""

from __future__ import annotations

import os

import torch

from refexp.config import TrainingConfig

CUBLAS_WORKSPACE_CONFIG = ":4096:8"
"""A fixed cuBLAS workspace (8 buffers of 4 MiB): what cuBLAS needs to pick the same reduction order every
call, and what torch's deterministic mode checks for (torch's "Reproducibility" notes; ``:16:8`` also
qualifies, smaller and slower)."""


def compile_cache_per_kernel_selection() -> None:
    """Keep Inductor's compiled-kernel cache apart for each ``ATEN_CPU_CAPABILITY`` (the CPU kernels torch picks
    at start-up; tests/README.md). torch's cache does not tell the kernel selections apart: blocks compiled
    under ``avx2`` and loaded by a process with the native AVX-512 kernels corrupt its heap (``free(): invalid
    size``), and the reverse returns NaN log-probs. A cache dir already named in the environment is kept."""
    capability = os.environ.get("ATEN_CPU_CAPABILITY")
    if capability and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{default_cache_dir()}_{capability}"


def apply_process_settings(training: TrainingConfig) -> None:
    """Set this process's threads and determinism from ``training``.

    Both values of ``deterministic`` are applied (not only true), so runs started one after another in one
    process (the test suite's) each get their own. A ``CUBLAS_WORKSPACE_CONFIG`` already in the environment
    is kept.
    """
    compile_cache_per_kernel_selection()
    if training.num_threads:
        torch.set_num_threads(training.num_threads)
    if training.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
    # raises at the first operation that has no deterministic implementation, naming it (warn_only=False)
    torch.use_deterministic_algorithms(training.deterministic)
    torch.backends.cudnn.deterministic = training.deterministic
    if training.deterministic:
        torch.backends.cudnn.benchmark = False  # the autotuner may pick another kernel in another run
