"""A hyper-parameter search selects on validation, never on test: the check that a search's task has a
validation split, made on the composed command line before the first trial (``refexp.cli.errors``)."""

from __future__ import annotations

from .errors import ConfigError
from .task import TaskConfig

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
"""Hydra's grid sweeper: it runs every job and ignores their return values. Every other sweeper (Optuna's,
``conf/hparams_search/``) maximises what the jobs return, ``refexp.run.search_value``: validation accuracy."""
VALIDATION_FIELDS = ("task", "task.name", "task.val_fraction", "task.val_path")
"""Config keys that decide whether a run has a validation split."""


def check_search_validation(sweeper_target: str, task: TaskConfig) -> None:
    """Refuse a search (a sweeper other than ``BASIC_SWEEPER``) whose task has no validation split: every
    trial would return no value, since ``run.search_value`` never falls back to test accuracy."""
    if sweeper_target == BASIC_SWEEPER or task.has_validation():
        return
    search = f"a search (hparams_search, hydra.sweeper={sweeper_target.rsplit('.', 1)[-1]})"
    if task.name == "preference":
        raise ConfigError(f"task=preference has no validation split (task.val_fraction and task.val_path are "
                          f"unset there), and {search} selects on validation accuracy, never on the held-out "
                          f"test pairs: search on a task with a validation split")
    raise ConfigError(f"task.val_fraction={task.val_fraction} with task.val_path={task.val_path} leaves "
                      f"task={task.name} without a validation split, and {search} selects on validation "
                      f"accuracy, never on the held-out test prompts: set task.val_fraction to a share in "
                      f"(0, 1) or task.val_path to a validation file")
