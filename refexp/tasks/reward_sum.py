"""The optimised reward when it is more than the verifier (``task.reward_model``, ``task.reward_funcs`` with
``task.reward_weights``) and the gold reward logged beside it (``task.gold_reward_model``, else the verifier).

As TRL's ``GRPOTrainer`` combines ``reward_funcs`` with ``reward_weights``: the reward of a completion is
sum_i w_i * r_i over the components (each computed on the whole batch), every weight 1 by default.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from refexp.config import TaskConfig
from refexp.tasks.reward_model import STAGE_MODEL, RewardModel, is_reward_model_entry
from refexp.tasks.rewards import load_reward

VERIFIER = "verifier"
"""The ``task.reward_funcs`` entry that names the task's own reward (or ``task.reward``)."""

BatchReward = Callable[[list[str], list[str], list[str]], list[float]]
"""``fn(prompts, completions, answers) -> [float]``, one score per completion."""


def per_sample(fn: Callable[[str, str], float], name: str) -> BatchReward:
    """A ``reward(completion, answer)`` function over a batch; a failure names the sample."""
    def batch(prompts: list[str], completions: list[str], answers: list[str]) -> list[float]:
        out = []
        for i, (p, c, a) in enumerate(zip(prompts, completions, answers)):
            try:
                out.append(float(fn(c, a)))
            except Exception as e:
                raise RuntimeError(f"reward function {name} failed on sample {i} (prompt {p!r}, completion {c!r}, "
                                   f"answer {a!r}): {type(e).__name__}: {e}") from e
        return out
    return batch


def of_model(model: RewardModel) -> BatchReward:
    return lambda prompts, completions, answers: model(prompts, completions)


@dataclass
class WeightedRewards:
    """sum_i ``weights[i]`` * ``parts[i]`` of each completion."""

    parts: Sequence[BatchReward]
    weights: Sequence[float]

    def __call__(self, prompts: list[str], completions: list[str], answers: list[str]) -> list[float]:
        total = [0.0] * len(completions)
        for part, w in zip(self.parts, self.weights):
            total = [t + w * r for t, r in zip(total, part(prompts, completions, answers))]
        return total


def names_stage_model(task_cfg: TaskConfig) -> bool:
    """Whether a reward field names the reward-model stage's model (``rm``: refexp/algos/rm.py)."""
    return STAGE_MODEL in (task_cfg.reward_model, task_cfg.gold_reward_model, *task_cfg.reward_funcs)


def with_rewards(task, task_cfg: TaskConfig, *, device="cpu", stage_model=None):
    """A copy of ``task`` whose ``optimised`` and ``gold`` are ``build_rewards``'s (GRPO's entry, before its first
    step); ``task`` itself is left as it was built."""
    optimised, gold = build_rewards(task_cfg, task.verify_batch, device=device, stage_model=stage_model)
    return replace(task, optimised=optimised, gold=gold)


def build_rewards(task_cfg: TaskConfig, verifier: BatchReward, *, device="cpu", stage_model=None
                  ) -> tuple[BatchReward | None, BatchReward | None]:
    """``(optimised, gold)`` of ``task_cfg``: (None, None) when the verifier alone is optimised (nothing changes);
    else the weighted sum and the gold reward (``gold_reward_model``, else the verifier). ``stage_model``: the dir a
    field's ``rm`` stands for (``ensure_rm``'s ``hf/``)."""
    if not task_cfg.learned_rewards():
        return None, None
    models: dict[str, RewardModel] = {}  # one copy of a model named twice

    def model(field_name: str, path: str) -> RewardModel:
        if path == STAGE_MODEL:
            if stage_model is None:
                raise ValueError(f"{field_name}=rm needs the reward-model stage's dir (refexp/algos/rm.py ensure_rm)")
            path = str(stage_model)
        if path not in models:
            models[path] = RewardModel(path, field_name=field_name, device=device, dtype=task_cfg.reward_model_dtype,
                                       batch_size=task_cfg.reward_model_batch_size,
                                       offload=task_cfg.reward_model_offload, prompts_rendered=task_cfg.chat_template)
        return models[path]

    if task_cfg.reward_model:
        optimised: BatchReward = of_model(model("task.reward_model", task_cfg.reward_model))
    elif task_cfg.reward_funcs:
        parts = []
        for entry in task_cfg.reward_funcs:
            if entry == VERIFIER:
                parts.append(verifier)
            elif is_reward_model_entry(entry):
                parts.append(of_model(model("task.reward_funcs[]", entry)))
            else:
                parts.append(per_sample(load_reward(entry, "task.reward_funcs[]"), entry))
        optimised = WeightedRewards(parts, [float(w) for w in task_cfg.reward_weights] or [1.0] * len(parts))
    else:
        optimised = verifier
    gold = (of_model(model("task.gold_reward_model", task_cfg.gold_reward_model)) if task_cfg.gold_reward_model
            else verifier)
    return optimised, gold
