"""torchtitan's training components that refexp uses as they are: optimizer and LR-schedule containers,
and the DCP ``CheckpointManager``.

Re-exported here so that every torchtitan import in refexp goes through ``refexp.titan``
(``refexp/optim.py`` builds the containers, ``refexp/checkpoint.py`` the manager).
"""

from __future__ import annotations

from torchtitan.components.checkpointer.dcp import CheckpointManager
from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer
from torchtitan.components.optimizer.optimizer import OptimizersContainer, ParamGroupConfig

__all__ = ["CheckpointManager", "LRSchedulersContainer", "OptimizersContainer", "ParamGroupConfig"]
