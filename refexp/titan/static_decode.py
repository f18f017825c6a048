"""Fixed-shape decoding (``rollout.static_decode``) that compiles once per bucket: the cache buffers the
fixed-shape step (``decode_step_plain.plain_static_step``) reads, kept and reused per (row bucket,
capacity), and the step compiled once for each.

Why buckets: a compiled step is specialised to its shapes (``dynamic=False``: CUDA graphs need fixed
shapes), so a step whose row count followed the batch (GRPO's rows, evaluation's, ``kl/init``'s) and whose
cache capacity followed the batch's longest prompt would compile anew for nearly every batch of real data,
until dynamo's ``recompile_limit`` (8 variants per code object) silently ran it eagerly. Here the row count
is padded to a power of two (at least ``MIN_ROWS``: ``bucket_rows``) and the capacity is the caller's fixed
one (``task.max_prompt_len`` + the generation budget in a run: ``rollout.decode_capacity``), so a run
compiles once per distinct bucket. Each bucket's step is a copy of the step function with its own code
object, so dynamo's per-code-object variants (and their limit) are per bucket, and a guard failure shows
up as a second compile of that bucket (``STATS.compiles``) rather than as a silent eager fallback.

Why kept buffers: CUDA graphs read and write the cache at fixed addresses (``torch._dynamo.mark_static_address``);
a new buffer per generation would make cudagraph trees record the graph again each time. A bucket's buffers
live until ``release_static_buckets()``: its K/V, [rows, n_kv, capacity, head_dim] per layer, is memory the
process holds between generations. The weights the step reads are kept at fixed addresses too, for the same
reason (``static_weights.py``: FSDP's gathered parameters move between generations).
"""

from __future__ import annotations

import dataclasses
import time
import types
from dataclasses import dataclass, field
from typing import Callable

import torch

from refexp.titan.decode_step_plain import plain_static_step

MIN_ROWS = 8
"""The smallest row bucket: fewer rows are padded to it (a few padding rows cost less than more buckets)."""

CPU_BACKEND: str | Callable | None = None
"""``torch.compile`` backend of the fixed-shape step on CPU; None: run it eagerly (CUDA graphs pay only where
kernel launches cost). Tests set a counting backend. On CUDA the step is compiled with inductor in
``mode="reduce-overhead"`` (CUDA graphs)."""


@dataclass
class StaticDecodeStats:
    """What fixed-shape decoding has cost this process (read by bench/gpu/gpu_smoke.py and the compile-count test)."""

    compiles: int = 0
    """Graphs the backend compiled (one per bucket when nothing recompiles)."""
    buckets: int = 0
    """Buckets made (row bucket x capacity x layout)."""
    first_step_s: float = 0.0
    """Seconds of the buckets' first steps: tracing, compiling and running once."""
    capture_s: float = 0.0
    """Seconds of the buckets' second steps: where cudagraph trees record the CUDA graph (on CUDA)."""


STATS = StaticDecodeStats()


def static_decode_stats() -> dict:
    """``STATS`` as a dict: compiles, buckets, first_step_s, capture_s (this process so far)."""
    return dataclasses.asdict(STATS)


def bucket_rows(n: int) -> int:
    """The row count a batch of ``n`` rows decodes with: the next power of two, at least ``MIN_ROWS``."""
    return max(MIN_ROWS, 1 << max(0, n - 1).bit_length())


@dataclass
class StaticBucket:
    """The fixed-address tensors of one bucket's step, overwritten in place by each generation that uses it.

    key_bufs/value_bufs: per layer [R, n_kv, C, head_dim], zero-initialised (the step reads unfilled slots
    under a mask; 0 x NaN would still be NaN). allowed_RC [R, C] bool: the slots each row's query may see.
    next_pos_R [R] long: each row's next RoPE position. slot_1 [1] long: the next slot. tokens_R [R] long:
    the step's input tokens (padding rows' are 0). ``step``: the step as it runs for this bucket.
    """

    rows: int
    capacity: int
    key_bufs: list[torch.Tensor]
    value_bufs: list[torch.Tensor]
    allowed_RC: torch.Tensor
    next_pos_R: torch.Tensor
    slot_1: torch.Tensor
    tokens_R: torch.Tensor
    step: Callable
    calls: int = 0
    in_use: bool = field(default=False, repr=False)

    @property
    def compiles_next_call(self) -> bool:
        """True while the bucket's step has not run yet (its first call traces and compiles where compiled)."""
        return self.calls == 0

    def run(self, w, tokens_B: torch.Tensor) -> torch.Tensor:
        """One step: ``tokens_B`` [n <= R] into the first rows; float32 logits [n, V] of those rows."""
        n = tokens_B.shape[0]
        self.tokens_R[:n].copy_(tokens_B)
        timed = self.calls < 2
        if timed:
            _sync(self.tokens_R.device)
            t0 = time.perf_counter()
        logits_RV = self.step(w, self.tokens_R, self.next_pos_R, self.slot_1, self.key_bufs, self.value_bufs,
                              self.allowed_RC)
        if timed:
            _sync(self.tokens_R.device)
            dt = time.perf_counter() - t0
            if self.calls == 0:
                STATS.first_step_s += dt
            else:
                STATS.capture_s += dt
        self.calls += 1
        self.next_pos_R.add_(1)  # in place: fixed addresses
        self.slot_1.add_(1)
        return logits_RV[:n]


_BUCKETS: dict[tuple, StaticBucket] = {}


def static_bucket(like_BNLH: torch.Tensor, n_layers: int, rows: int, capacity: int) -> StaticBucket:
    """The bucket for ``rows`` (already bucketed) and ``capacity`` slots, with K/V laid out like ``like_BNLH``
    (a layer's [B, n_kv, L, head_dim]: dtype, device, heads), made at its first use."""
    _, N, _, H = like_BNLH.shape
    device = like_BNLH.device
    key = (str(device), like_BNLH.dtype, n_layers, N, H, rows, capacity)
    bucket = _BUCKETS.get(key)
    if bucket is None:
        def buf(shape, dtype):
            t = torch.zeros(shape, dtype=dtype, device=device)
            if t.is_cuda:
                torch._dynamo.mark_static_address(t)
            return t
        kv = (rows, N, capacity, H)
        bucket = StaticBucket(rows, capacity, [buf(kv, like_BNLH.dtype) for _ in range(n_layers)],
                              [buf(kv, like_BNLH.dtype) for _ in range(n_layers)],
                              buf((rows, capacity), torch.bool), buf((rows,), torch.long), buf((1,), torch.long),
                              buf((rows,), torch.long), _compiled_step(device, f"{rows}x{capacity}"))
        _BUCKETS[key] = bucket
        STATS.buckets += 1
    if bucket.in_use:
        raise RuntimeError(f"the static decode bucket of {rows} rows x {capacity} slots is in use: finish_decode "
                           "the generation that holds it first (one fixed-shape generation at a time per bucket)")
    bucket.in_use = True
    return bucket


def release_static_buckets() -> None:
    """Drop every bucket's buffers and compiled step, and the kept decode weights (``static_weights.py``): the
    memory they hold; the next use compiles again."""
    from refexp.titan.static_weights import release_static_weights

    _BUCKETS.clear()
    release_static_weights()


def _counting(backend):
    """``backend`` that adds one to ``STATS.compiles`` per graph it compiles."""
    def compile_counted(gm, example_inputs):
        STATS.compiles += 1
        return backend(gm, example_inputs)
    return compile_counted


def _compiled_step(device: torch.device, tag: str) -> Callable:
    """The fixed-shape step for one bucket: a copy of ``plain_static_step`` with its own code object, compiled
    (CUDA: inductor + CUDA graphs; CPU: ``CPU_BACKEND``, else eager)."""
    if device.type == "cuda":
        # mode="reduce-overhead" as torch.compile builds it, wrapped to count (a custom backend takes no mode)
        backend = torch._TorchCompileInductorWrapper("reduce-overhead", None, False)
    elif CPU_BACKEND is not None:
        backend = CPU_BACKEND if callable(CPU_BACKEND) else torch._dynamo.lookup_backend(CPU_BACKEND)
    else:
        return plain_static_step
    fn = plain_static_step
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{tag.replace('x', '_x_')}")
    own = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
    return torch.compile(own, backend=_counting(backend), dynamic=False, fullgraph=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
