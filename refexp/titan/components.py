"""torchtitan's training components that refexp uses: optimizer and LR-schedule containers, and the DCP
``CheckpointManager`` (pruning deferred, see below).

Re-exported here so that every torchtitan import in refexp goes through ``refexp.titan``
(``refexp/components/optim.py`` builds the containers, ``refexp/components/checkpoint.py`` the manager).
"""

from __future__ import annotations

import os
import re

from torchtitan.components.checkpointer.dcp import CheckpointManager as _TitanCheckpointManager
from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer
from torchtitan.components.optimizer.optimizer import OptimizersContainer, ParamGroupConfig

__all__ = ["CheckpointManager", "LRSchedulersContainer", "OptimizersContainer", "ParamGroupConfig"]

STEP_DIR = re.compile(r"step-(\d+)")
"""The name of a checkpoint dir refexp writes (``fullmatch``: nothing before or after)."""


class CheckpointManager(_TitanCheckpointManager):
    """torchtitan's manager, except that a save does not prune older checkpoints by itself: refexp
    prunes (``purge_stale_checkpoints``) only once the new checkpoint's manifest is written
    (``refexp.components.checkpoint.Checkpointer.save``), so that ``keep_latest_k`` never deletes a verified
    checkpoint for one that a crash left without its manifest."""

    def _purge_stale_checkpoints(self) -> None:  # called by torchtitan's _save, before the manifest
        pass

    def purge_stale_checkpoints(self) -> None:
        """torchtitan's pruning, of refexp's own dirs only: all but the newest ``keep_latest_k`` directories named
        exactly ``step-<N>`` (rank 0, in torchtitan's purge thread). torchtitan's matches any name containing
        ``step-N`` (``re.search``), and would delete a user's ``step-4.keep`` or ``notes-step-1``."""
        if not self._should_purge():
            return
        found = sorted((int(m.group(1)), path) for name in os.listdir(self.folder)
                       if (m := STEP_DIR.fullmatch(name)) and os.path.isdir(path := os.path.join(self.folder, name)))
        for _, path in found[: -self.keep_latest_k]:
            self.purge_queue.put(path)
