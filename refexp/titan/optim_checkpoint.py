"""What refexp uses of ``torchtitan.components``: the optimizer and LR-schedule containers, and the DCP
``CheckpointManager`` (pruning deferred, see below).

Re-exported here so that every torchtitan import in refexp goes through ``refexp.titan``
(``refexp/components/optim.py`` builds the containers, ``refexp/components/checkpoint.py`` the manager).
"""

from __future__ import annotations

import os
import re
from typing import Any

from torchtitan.components.checkpointer.dcp import MODEL
from torchtitan.components.checkpointer.dcp import CheckpointManager as _TitanCheckpointManager
from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer
from torchtitan.components.optimizer.optimizer import OptimizersContainer, ParamGroupConfig

from refexp.titan.dcp_reader import SafeFileSystemReader, checked_dcp_metadata

__all__ = ["MODEL", "CheckpointManager", "LRSchedulersContainer", "OptimizersContainer", "ParamGroupConfig"]

STEP_DIR = re.compile(r"step-(\d+)")
"""The name of a checkpoint dir refexp writes (``fullmatch``: nothing before or after)."""


class CheckpointManager(_TitanCheckpointManager):
    """torchtitan's manager, except that a save does not prune older checkpoints by itself: refexp
    prunes (``purge_stale_checkpoints``) only once the new checkpoint's manifest is written
    (``refexp.components.checkpoint.Checkpointer.save``), so that ``keep_latest_k`` never deletes a verified
    checkpoint for one that a crash left without its manifest; and a load reads ``.metadata`` through the
    restricted unpickler (``refexp/titan/dcp_reader.py``)."""

    def dcp_load(self, state_dict: dict[str, Any], checkpoint_id: str, from_hf: bool, from_quantized: bool) -> None:
        """torchtitan's ``dcp_load`` of a DCP checkpoint (it builds a plain ``FileSystemReader``) with
        ``SafeFileSystemReader``; HF safetensors (no pickle) go to torchtitan's."""
        if from_hf:
            return super().dcp_load(state_dict, checkpoint_id, from_hf, from_quantized)
        import torch.distributed.checkpoint as dcp

        checked_dcp_metadata(checkpoint_id)  # a refused file: one line naming it, before DCP wraps the error
        dcp.load(state_dict, storage_reader=SafeFileSystemReader(checkpoint_id))
        if MODEL in self.states:  # torchtitan flattens the model's states into state_dict (its dcp_load)
            self.states[MODEL].load_state_dict(state_dict)

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
