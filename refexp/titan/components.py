"""torchtitan's training components that refexp uses: optimizer and LR-schedule containers, and the DCP
``CheckpointManager`` (pruning deferred, see below).

Re-exported here so that every torchtitan import in refexp goes through ``refexp.titan``
(``refexp/components/optim.py`` builds the containers, ``refexp/components/checkpoint.py`` the manager).
"""

from __future__ import annotations

from typing import Any

from torchtitan.components.checkpointer.dcp import MODEL
from torchtitan.components.checkpointer.dcp import CheckpointManager as _TitanCheckpointManager
from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer
from torchtitan.components.optimizer.optimizer import OptimizersContainer, ParamGroupConfig

from refexp.titan.dcp_reader import SafeFileSystemReader, checked_dcp_metadata

__all__ = ["CheckpointManager", "LRSchedulersContainer", "OptimizersContainer", "ParamGroupConfig"]


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
        """torchtitan's pruning: all but the newest ``keep_latest_k`` ``step-N`` dirs (rank 0, in a thread)."""
        super()._purge_stale_checkpoints()
