"""The built-in rollout engine with a recorder, and optionally a change (log-probs shifted away from the
trainer's by a known amount), on GRPO's training rollouts: the ones keyed ``(seed, step, prompt id, sample id)``
per row. Evaluation's generations pass through untouched."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch

from refexp.components import sampler


@dataclass
class TrainingRollout:
    step: int
    prompt_ids: list[int]  # one per row: a prompt's group_size rows share it
    prompts: list[str]
    rollout: sampler.Rollout  # as the step receives it (after ``change``)


def record_training_rollouts(monkeypatch, change: Callable[[sampler.Rollout], sampler.Rollout] | None = None
                             ) -> list[TrainingRollout]:
    """Installs the engine for ``rollout=builtin`` for the rest of the test; the returned list fills with
    each training rollout in order. ``change`` maps the engine's rollout to the one the step gets."""
    from refexp.components import rollout
    seen: list[TrainingRollout] = []

    class Recording(rollout.BuiltinEngine):
        def generate(self, prompts, **kw):
            r = super().generate(prompts, **kw)
            keys = kw.get("keys") or []
            if not keys or len(keys[0]) != 4:
                return r
            r = change(r) if change else r
            seen.append(TrainingRollout(keys[0][1], [k[2] for k in keys], list(prompts), r))
            return r

    monkeypatch.setitem(rollout.ENGINES, "builtin", Recording)
    return seen


def shift_behaviour_logprobs(monkeypatch, shift: Callable[[torch.Tensor], torch.Tensor]
                             ) -> tuple[list[TrainingRollout], list[torch.Tensor]]:
    """Adds ``shift(mask_BT)`` [N, T-1] to the engine's behaviour log-probs on the completion tokens of each
    training rollout; returns the recorded rollouts and the added shifts (0 off the mask), one per rollout."""
    added = []

    def change(r):
        added.append(torch.where(r.mask_BT, shift(r.mask_BT), torch.zeros(())))
        return dataclasses.replace(r, behaviour_logp=r.behaviour_logp + added[-1])

    return record_training_rollouts(monkeypatch, change), added


def by_row_parity(even: float, odd: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """A shift of ``even`` on every token of the even rows and ``odd`` on the odd rows."""
    return lambda mask_BT: torch.where(torch.arange(mask_BT.shape[0])[:, None] % 2 == 0, even, odd).expand(
        mask_BT.shape)
