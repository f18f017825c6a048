"""The ``rollout/`` group: the engine that generates completions (GRPO rollouts, evaluation samples, DPO pairs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .errors import one_of, positive_int

ROLLOUT_ENGINES = ("builtin",)


@dataclass
class RolloutConfig:
    """Which ``refexp.components.rollout.RolloutEngine`` generates;
    docs/rollout-engines.md shows how another plugs in."""

    name: str = "builtin"
    """builtin: refexp's KV-cache decoder over the trainer's own model (refexp/components/sampler.py)."""
    stop_check_every: Optional[int] = None
    """Decode steps between checks that every row has stopped (each check waits for the device and, with
    several ranks, is a collective). Rows that stopped keep emitting padding, which is masked, so the
    completions are the same for any value. None = 1 on CPU (a check costs nothing there), 8 on CUDA.
    At a check, finished rows leave the decode batch once they are an eighth of it."""
    static_decode: bool = False
    """Decode with fixed shapes, so that the one-token step can be captured: every step attends over the
    cache's whole capacity under a mask of filled slots and writes its keys/values at a slot index held on
    the device; finished rows stay in the batch. On CUDA the step is compiled with
    ``torch.compile(mode="reduce-overhead")`` (CUDA graphs: one launch per step instead of one per operator);
    on CPU it runs eagerly (the same numbers; the capture pays only where kernel launches cost). The rows are
    padded to a power of two (at least 8) and the cache holds task.max_prompt_len + the generation budget
    slots, so the step compiles once per row bucket; each bucket's KV buffers are kept between generations,
    and for an FSDP-wrapped policy so is a copy of the weights the step reads (the whole model in the compute
    dtype: FSDP's gathered parameters move between generations, a CUDA graph reads fixed addresses). Needs
    plain weights: not with tensor parallelism."""

    def __post_init__(self) -> None:
        one_of("rollout.name", self.name, ROLLOUT_ENGINES)
        if self.stop_check_every is not None:
            positive_int("rollout.stop_check_every", self.stop_check_every)

    def stop_check_interval(self, device_type: str) -> int:
        if self.stop_check_every is not None:
            return self.stop_check_every
        return 8 if device_type == "cuda" else 1
