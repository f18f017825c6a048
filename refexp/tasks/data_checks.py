"""The task data a run needs, checked before any model is fetched, converted or built (``refexp/run.py`` calls
``check_task_data`` right after the config's own checks).

- A reasoning-gym task's splits are drawn (``refexp.tasks.reasoning_gym_splits.drawn``, kept for the task build):
  a split of ``task.dataset`` that cannot get its distinct questions is refused here, not after minutes of
  fetching and converting a pretrained model.
"""

from __future__ import annotations

from refexp.config import RootConfig


def check_task_data(cfg: RootConfig) -> None:
    """The checks of the module doc on a validated config: a reasoning-gym task's splits drawn; nothing for a task
    whose data is read when it is built."""
    if cfg.task.name != "reasoning_gym":
        return
    from refexp.tasks.reasoning_gym_splits import drawn

    drawn(cfg.task)
