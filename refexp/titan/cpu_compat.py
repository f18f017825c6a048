"""What torchtitan 0.3.0 needs to import and run on a CPU-only machine, and the device to run on.

Installs the expert-parallel kernels stand-in when this module is imported, which
``refexp/titan/__init__.py`` does before any module that imports torchtitan
(docs/torchtitan-notes.md §1). ``prepare_torchtitan`` re-points torchtitan's import-time
``device_type`` copies (§2); ``resolve_device`` turns ``training.device`` into a torch.device.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types

import torch

from refexp.config import ConfigError

# Names that torchtitan.distributed.minimal_async_ep.api imports from its triton kernels module.
_EP_KERNEL_NAMES = (
    "copy_full_counts_to_peers_kernel",
    "copy_rows_to_peers_kernel",
    "expand_topk_grad_kernel",
    "fill_combine_metadata_kernel",
    "fill_dispatch_metadata_kernel",
    "invert_flat_indices_kernel",
    "reduce_topk_slots_kernel",
    "topk_scores_grad_kernel",
)
_EP_KERNELS_MODULE = "torchtitan.distributed.minimal_async_ep.kernels"


def _install_ep_kernel_standin() -> None:
    """Let ``import torchtitan.models.common`` work without triton (docs/torchtitan-notes.md §1).

    Only the expert-parallel kernels module needs triton; it is replaced by a module whose functions
    raise if called. ``triton`` itself is not stubbed: inductor probes for it.
    """
    if _EP_KERNELS_MODULE in sys.modules or importlib.util.find_spec("triton") is not None:
        return
    standin = types.ModuleType(_EP_KERNELS_MODULE)
    standin.__doc__ = "refexp stand-in: MinimalAsyncEP kernels need triton, which is not installed."

    def _needs_triton(*args, **kwargs):
        raise RuntimeError("MinimalAsyncEP kernels need triton "
                           "(refexp installed a stand-in; docs/torchtitan-notes.md §1)")

    for name in _EP_KERNEL_NAMES:
        setattr(standin, name, _needs_triton)
    sys.modules[_EP_KERNELS_MODULE] = standin


# At import: refexp/titan/__init__.py imports this module before any module that imports torchtitan.
_install_ep_kernel_standin()


# torchtitan modules that copy ``torchtitan.tools.utils.device_type`` at import time
# (docs/torchtitan-notes.md §2).
_DEVICE_TYPE_MODULES = (
    "torchtitan.tools.utils",
    "torchtitan.distributed.parallel_dims",
    "torchtitan.distributed.utils",
    "torchtitan.models.common.token_dispatcher",
    "torchtitan.components.metrics",
)


def resolve_device(device: str) -> torch.device:
    """``auto`` | ``cpu`` | ``cuda`` | ``cuda:N`` -> a torch.device; every part of a run uses this one.

    ``cuda`` (and ``auto`` with a GPU) is ``cuda:<LOCAL_RANK % visible GPUs>``: one GPU per process under
    torchrun, and ``cuda:0`` when a scheduler shows each task only its own GPU (``CUDA_VISIBLE_DEVICES``)
    whatever its local rank. ``cuda:N`` pins the process to GPU N (a job of a sweep that runs
    single-GPU jobs side by side, conf/hydra/launcher/joblib.yaml).
    """
    kind, _, index = device.partition(":")
    if kind not in ("auto", "cpu", "cuda") or (index and (kind != "cuda" or not index.isdigit())):
        raise ConfigError(f"training.device={device!r} is invalid: expected one of auto, cpu, cuda, cuda:N")
    if kind == "cpu" or (kind == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"training.device={device!r} is invalid: no CUDA device is visible (use auto or cpu)")
    count = torch.cuda.device_count()
    if index:
        if int(index) >= count:
            raise ConfigError(f"training.device={device!r} is invalid: {count} CUDA device(s) visible "
                              f"(cuda:0 .. cuda:{count - 1})")
        return torch.device("cuda", int(index))
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % count)


def enable_tf32() -> None:
    """TF32 for float32 matmuls (cuBLAS) and cuDNN convolutions: process-wide, CUDA only."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


def prepare_torchtitan(device_type: str) -> None:
    """Apply the process-wide CPU workarounds; idempotent, cheap, safe to call before every build.

    Re-points torchtitan's module-level ``device_type``/``device_module`` copies to ``device_type``
    (they default to "cuda" on a machine without GPUs, docs/torchtitan-notes.md §2) in every such
    module imported so far, so call it again after importing more of torchtitan. On CUDA it also turns
    TF32 on for float32 matmuls and convolutions (as torchtitan's trainer runs: the bf16 compute default
    makes the model's matmuls bf16; TF32 speeds up runs with ``mixed_precision_param=float32``).
    """
    _install_ep_kernel_standin()
    if device_type == "cuda":
        enable_tf32()
    device_module = torch.cpu if device_type == "cpu" else getattr(torch, device_type)
    for name in _DEVICE_TYPE_MODULES:
        module = sys.modules.get(name)
        if module is None:
            continue
        if hasattr(module, "device_type"):
            module.device_type = device_type
        if hasattr(module, "device_module"):
            module.device_module = device_module
