"""torchtitan's training components that refexp uses: optimizer and LR-schedule containers, and the DCP
``CheckpointManager`` (pruning deferred, see below).

Re-exported here so that every torchtitan import in refexp goes through ``refexp.titan``
(``refexp/components/optim.py`` builds the containers, ``refexp/components/checkpoint.py`` the manager).
"""

from __future__ import annotations

from torchtitan.components.checkpointer.dcp import CheckpointManager as _TitanCheckpointManager
from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer
from torchtitan.components.optimizer.optimizer import OptimizersContainer, ParamGroupConfig

__all__ = ["CheckpointManager", "LRSchedulersContainer", "OptimizersContainer", "ParamGroupConfig"]


class CheckpointManager(_TitanCheckpointManager):
    """torchtitan's manager, except that a save does not prune older checkpoints by itself: refexp
    prunes (``purge_stale_checkpoints``) only once the new checkpoint's manifest is written
    (``refexp.components.checkpoint.Checkpointer.save``), so that ``keep_latest_k`` never deletes a verified
    checkpoint for one that a crash left without its manifest."""

    def _purge_stale_checkpoints(self) -> None:  # called by torchtitan's _save, before the manifest
        pass

    def purge_stale_checkpoints(self) -> None:
        """torchtitan's pruning: all but the newest ``keep_latest_k`` ``step-N`` dirs (rank 0, in a thread)."""
        super()._purge_stale_checkpoints()
