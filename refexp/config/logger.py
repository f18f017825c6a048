"""The ``logger/`` group: W&B on rank 0, and always ``<run dir>/metrics.jsonl``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .errors import one_of


@dataclass
class LoggerConfig:
    """W&B on rank 0 (offline unless WANDB_MODE / an API key says otherwise) + <run dir>/metrics.jsonl."""

    name: str = "wandb"
    """wandb | none (none still writes metrics.jsonl)."""
    project: str = "refexp"
    """W&B project."""
    entity: Optional[str] = None
    """W&B entity (None = the API key's default)."""
    mode: Optional[str] = None
    """online | offline | disabled; None = $WANDB_MODE, else online if an API key is set, else offline."""
    group: Optional[str] = None
    """None = one group per sweep (the multirun directory's name)."""
    tags: list[str] = field(default_factory=list)
    """Extra W&B tags (algo:, task: and ref: tags are always added)."""
    progress: bool = True
    """A progress bar on rank 0."""

    def __post_init__(self) -> None:
        one_of("logger.name", self.name, ("wandb", "none"))
        if self.mode is not None:
            one_of("logger.mode", self.mode, ("online", "offline", "disabled"))
