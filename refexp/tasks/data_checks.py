"""The task data a run needs, checked before any model is fetched, converted or built (``refexp/run.py`` calls
``check_task_data`` right after the config's own checks).

- A reasoning-gym task's splits are drawn (``refexp.tasks.reasoning_gym_splits.drawn``, kept for the task build):
  a split of ``task.dataset`` that cannot get its distinct questions is refused here, not after minutes of
  fetching and converting a pretrained model.
- Reference answers, for whatever trains on them (``target_uses``): some reasoning-gym datasets have none (puzzles
  with many valid solutions, whose entries' ``answer`` is None: graph_color, propositional_logic, rubiks_cube,
  rush_hour, boxnet in reasoning-gym 0.1.25); their scorer checks a completion on its own, so GRPO from a start
  that needs no demonstrations trains on them, and the SFT stage, DPO's chosen side or the continued-SFT baseline
  is refused in one line (``check_targets``) instead of training on the text "None".
"""

from __future__ import annotations

from typing import Optional

import datasets

from refexp.config import ConfigError, RootConfig, TaskConfig

SFT_STAGE = "the SFT stage (sft.enable=true without sft.checkpoint) would train on them"
DPO_CHOSEN = "algo=dpo would take them as the chosen side of its pairs"
CONTINUED_SFT = "algo.objective=continued_sft would train on them"
"""What trains on a task's reference answers, as ``check_targets`` names it."""


def target_uses(cfg: RootConfig) -> list[str]:
    """What in the run ``cfg`` trains on the task's reference answers (the ``completion`` column); [] for a run that
    only generates and scores."""
    out = []
    if cfg.sft.enable and not cfg.sft.checkpoint:
        out.append(SFT_STAGE)
    if cfg.algo.name == "dpo" and cfg.task.preference_path is None:
        out.append(DPO_CHOSEN)
    if getattr(cfg.algo, "objective", None) == "continued_sft":
        out.append(CONTINUED_SFT)
    return out


def task_words(task_cfg: TaskConfig) -> str:
    """The task as an error names it: ``task.dataset='graph_color'`` for reasoning-gym, else ``task=<name>``."""
    return f"task.dataset={task_cfg.dataset!r}" if task_cfg.name == "reasoning_gym" else f"task={task_cfg.name}"


def check_targets(task_cfg: TaskConfig, rows: Optional[datasets.Dataset], uses: list[str]) -> None:
    """ConfigError naming the dataset when ``rows`` (a split's ``completion`` column) hold no reference answer
    and something in ``uses`` (``target_uses``) would train on them."""
    if not uses or rows is None or "completion" not in rows.column_names:
        return
    missing = sum(text is None for text in rows["completion"])
    if not missing:
        return
    raise ConfigError(f"{task_words(task_cfg)} has no reference answers to train on ({missing} of its {len(rows)} "
                      f"training rows have answer None: its scorer checks a completion on its own), and "
                      f"{uses[0]}; expected algo=grpo from a start that needs no demonstrations (sft.enable=false "
                      f"with model.hf_assets_path or model=smollm2_135m, or sft.checkpoint=DIR), which the "
                      f"dataset's scorer rewards, or a dataset with answers")


def check_task_data(cfg: RootConfig) -> None:
    """The checks of the module doc on a validated config: a reasoning-gym task's splits drawn and its training
    rows' reference answers; nothing for a task whose data is read when it is built."""
    if cfg.task.name != "reasoning_gym":
        return
    from refexp.tasks.reasoning_gym_splits import drawn

    check_targets(cfg.task, drawn(cfg.task).train, target_uses(cfg))
