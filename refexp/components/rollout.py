"""The rollout-engine seam: what generates the completions GRPO trains on, evaluation scores and DPO pairs.

A ``RolloutEngine`` turns prompts into a ``sampler.Rollout`` (tokens in the training layout, completion mask,
the engine's own log-probs of the sampled tokens) and takes the policy's current weights before a rollout.
``rollout=builtin`` (``BuiltinEngine``) decodes with refexp's KV-cache sampler on the trainer's own model, so
"loading the weights" is holding a reference to it and its log-probs are the trainer's up to kernel
differences (``rollout/logprob_diff`` measures them). docs/rollout-engines.md describes an external engine
(vLLM): weights synced through the HF state-dict adapter, one seeded request per row, and the trainer
correcting for the log-prob mismatch (``algo.tis_cap``).
"""

from __future__ import annotations

from typing import Protocol

import torch

from refexp.components import sampler
from refexp.config import RolloutConfig, RootConfig
from refexp.config.root import generation_budget


class RolloutEngine(Protocol):
    name: str

    def load_weights(self, model: torch.nn.Module) -> None:
        """Take ``model``'s current weights (the policy after its last update) for the next generations."""

    def generate(self, prompts: list[str], *, max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
                 greedy: bool = False, keys: list[tuple[int, ...]] | None = None,
                 max_prompt_len: int | None = None) -> sampler.Rollout:
        """One completion per prompt (repeat a prompt for a group); ``keys[i]`` seeds row i's sampling."""


class BuiltinEngine:
    """refexp's KV-cache decoder (``refexp/components/sampler.py``) over the trainer's own module: no weight copy."""

    name = "builtin"

    def __init__(self, model: torch.nn.Module, tokenizer, cfg: RolloutConfig | None = None, *,
                 capacity: int | None = None):
        self.model, self.tokenizer = model, tokenizer
        device = next(model.parameters()).device
        cfg = cfg or RolloutConfig()
        self.stop_check_every = cfg.stop_check_interval(device.type)
        self.static_decode = cfg.static_decode
        self.capacity = capacity

    def load_weights(self, model: torch.nn.Module) -> None:
        self.model = model

    def generate(self, prompts, *, max_new_tokens, temperature=1.0, top_p=1.0, greedy=False, keys=None,
                 max_prompt_len=None) -> sampler.Rollout:
        return sampler.generate(self.model, self.tokenizer, prompts, max_new_tokens=max_new_tokens,
                                temperature=temperature, top_p=top_p, greedy=greedy, keys=keys,
                                max_prompt_len=max_prompt_len, stop_check_every=self.stop_check_every,
                                static_decode=self.static_decode, static_capacity=self.capacity)


ENGINES = {"builtin": BuiltinEngine}
"""``rollout.name`` -> the engine class."""


def build_engine(cfg: RolloutConfig, model: torch.nn.Module, tokenizer, *, capacity: int | None = None
                 ) -> RolloutEngine:
    """The configured engine, holding ``model``'s weights. ``capacity``: the cache slots every generation of
    the run fits in (``decode_capacity``); ``rollout.static_decode`` pads to it so that its compiled step
    does not follow each batch's longest prompt."""
    return ENGINES[cfg.name](model, tokenizer, cfg, capacity=capacity)


def decode_capacity(cfg: RootConfig) -> int:
    """``task.max_prompt_len`` + the most new tokens any generation of the run asks for: the same for GRPO's
    rollouts, evaluation, ``kl/init`` and DPO's pairs."""
    return cfg.task.max_prompt_len + generation_budget(cfg)[1]
