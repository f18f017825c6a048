"""The built-in rollout engine with a recorder (and optionally a change) on GRPO's training rollouts, the
ones keyed ``(seed, step, prompt id, sample id)`` per row; evaluation's generations pass through untouched."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from refexp import sampler


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
    from refexp import rollout

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
