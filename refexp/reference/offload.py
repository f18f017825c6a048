"""``reference.offload``: a frozen model parked in host memory and lent to the compute device for its forwards.

The host copy is made once (``park_on_host``), pinned where there is an accelerator, so each move to the
device is a non-blocking copy that can overlap the host's work. After a use the module's parameters and
buffers point at the parked host tensors again: nothing is copied back, because a forward does not change
the weights, and a moving reference is updated on its host copy itself (``refexp/reference/strategies.py``), so its
host copy is always the current one. Per use that is one host-to-device copy of the model, and none back.

FSDP2 re-pads a sharded parameter whose rows do not divide evenly over the ranks each time its tensor is
replaced (``FSDPParam.reset_sharded_param``); such a parameter's host copy is re-made unpinned by that, so its
later moves are synchronous (same values, slower).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

import torch
from torch.distributed.tensor import DTensor

HOST = torch.device("cpu")


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of ``model``'s parameters (of this rank's shards under FSDP/TP)."""
    return next(model.parameters()).device


def pin_host_memory() -> bool:
    """Whether host copies are pinned: only with an accelerator (pinning needs its driver)."""
    return torch.cuda.is_available()


def host_copy(t: torch.Tensor, pin: bool) -> torch.Tensor:
    """``t`` in host memory (pinned when ``pin``), a DTensor staying a DTensor with its placements."""
    t = t.detach().to(HOST)
    if not pin:
        return t
    if isinstance(t, DTensor):
        return DTensor.from_local(t.to_local().pin_memory(), t.device_mesh, t.placements, run_check=False,
                                  shape=t.shape, stride=t.stride())
    return t.pin_memory()


def copy_to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """One tensor's host-to-device copy (non-blocking: from pinned memory it is asynchronous, and work on
    the device's stream waits for it)."""
    return t.to(device, non_blocking=True)


def park_on_host(model: torch.nn.Module) -> None:
    """Move ``model`` into host memory once (pinned where ``pin_host_memory``).

    ``Module._apply`` moves plain modules and FSDP2-sharded ones alike: FSDP2's ``FSDPModule._apply``
    re-registers its sharded parameters after a move (torch/distributed/fsdp/_fully_shard/_fully_shard.py).
    """
    pin = pin_host_memory()
    model._apply(lambda t: host_copy(t, pin))


def build_parked(build: Callable[[], torch.nn.Module], *, offload: bool
                 ) -> tuple[torch.nn.Module, torch.device | None]:
    """A frozen model from ``build()`` and, with ``offload``, the device it computes on, the model parked in host
    memory until ``on_device`` lends it there (None without: the model stays where it was built). The reference
    strategies and the kl/init anchor keep their frozen models so."""
    model = build()
    if not offload:
        return model, None
    device = model_device(model)
    park_on_host(model)
    return model, device


@contextmanager
def on_device(model: torch.nn.Module | None, device: torch.device | None):
    """Within the block ``model`` (parked in host memory) is on ``device``; after it, its parameters and
    buffers are the host tensors they were before, not copies back. The block must not change the weights
    (a forward; the reference's updates run on the host copy). A no-op when either is None or ``device`` is
    the host (a CPU run: offloading changes nothing there)."""
    if model is None or device is None or device == HOST:
        yield model
        return
    parked: list[torch.Tensor] = []  # the host tensors, in Module._apply's order (the same both ways)

    def to_device(t: torch.Tensor) -> torch.Tensor:
        parked.append(t.detach())  # an alias of the host storage; survives the swap of a DTensor parameter
        return copy_to_device(t, device)

    model._apply(to_device)
    try:
        yield model
    finally:
        back = iter(parked)

        def to_host(t: torch.Tensor) -> torch.Tensor:
            h = next(back)
            assert h.shape == t.shape and h.dtype == t.dtype, f"offload: {tuple(t.shape)} is not {tuple(h.shape)}"
            return h

        model._apply(to_host)
