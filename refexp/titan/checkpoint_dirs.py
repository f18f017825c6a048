"""Weights directories on disk: refexp's model-only DCP checkpoints (save and load, reshardable), a
run's ``checkpoint/step-N``, and ``load_weights``, the one entry point that loads any of them or an
HF safetensors dir into a built model.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch.nn as nn

from refexp.config import ConfigError, ModelConfig
from refexp.record.checkpoints import complete_steps, dcp_structure_mismatch, newest_verified_step
from refexp.record.pins import is_hf_dir  # the start's pin decides the format as the loader does: re-exported
from refexp.runtime.distributed import decided_by_rank0
from refexp.titan.dcp_reader import SafeFileSystemReader, checked_dcp_metadata
from refexp.titan.hf_weights import load_hf_weights_
from refexp.titan.lora import is_adapter_name


def latest_checkpoint_step(folder: str | os.PathLike) -> int:
    """Highest ``step-N`` under folder whose DCP metadata was written (-1 if none); unverified: the
    newest that passes its manifest is ``refexp.record.checkpoints.newest_verified_step``."""
    return max(complete_steps(folder), default=-1)


def save_model_weights(model: nn.Module, checkpoint_dir: str | os.PathLike) -> None:
    """Model-only DCP checkpoint (reshardable: loads into any parallelism)."""
    import torch.distributed.checkpoint as dcp

    dcp.save(model.state_dict(), checkpoint_id=str(checkpoint_dir))


def dcp_dir(checkpoint_dir: str | os.PathLike) -> Path:
    """The DCP folder a weights directory's model is read from: ``model/`` of a refexp SFT output, the dir
    itself when it holds ``.metadata`` (a ``checkpoint/step-N``), else a run dir's newest checkpoint that
    verifies against its manifest (refexp/record/checkpoints.py). ``ConfigError`` when there is none."""
    path = Path(checkpoint_dir)
    if not path.is_dir():
        raise ConfigError(f"checkpoint directory {str(path)!r} does not exist")
    if (path / "model").is_dir() and (path / "model" / ".metadata").is_file():
        return path / "model"  # a refexp SFT output dir
    if (path / ".metadata").is_file():
        return path
    step = newest_verified_step(path / "checkpoint")
    if step >= 0:
        return path / "checkpoint" / f"step-{step}"
    raise ConfigError(
        f"{str(checkpoint_dir)!r} holds no DCP checkpoint (.metadata) that verifies — expected a refexp SFT "
        f"output, a run's checkpoint/step-N, or a run dir with checkpoint/"
    )


def check_dcp_dir(path: Path) -> None:
    """``ConfigError`` in one line naming ``path`` unless its ``.metadata`` reads through the restricted unpickler
    and every shard is as long as it says: a crafted file, a truncated or missing shard are named here, not
    run or left to DCP's ``EOFError``."""
    checked_dcp_metadata(path)
    problem = dcp_structure_mismatch(path)
    if problem is not None:
        raise ConfigError(f"the DCP checkpoint {path} cannot be loaded: {problem}")


def load_model_weights(model: nn.Module, checkpoint_dir: str | os.PathLike) -> None:
    """Load model weights from a refexp model-only checkpoint, a run's ``checkpoint/step-N``, or a run dir
    (``dcp_dir``: which one is rank 0's view, every rank reads the same folder). Its ``.metadata`` is read
    by the restricted unpickler (``titan/dcp_reader.py``): a crafted one is refused in one line, unrun."""
    import torch.distributed.checkpoint as dcp

    def checked() -> Path:
        path = dcp_dir(checkpoint_dir)
        check_dcp_dir(path)
        return path

    path = decided_by_rank0(checked)
    # A LoRA policy's adapters and reference parts are not in a start checkpoint: they keep their initial values
    state = {k: v for k, v in model.state_dict().items() if not is_adapter_name(k)}
    dcp.load(state, storage_reader=SafeFileSystemReader(str(path)))
    missing, _ = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not is_adapter_name(k)]
    if missing:
        raise RuntimeError(f"{path}: loading left {missing[:5]} unset")


def load_weights(model: nn.Module, model_cfg: ModelConfig, path: str | os.PathLike, *,
                 hf: bool | None = None) -> None:
    """Load the weights in ``path`` into ``model`` in place: the one entry point for a weights directory.

    ``hf=True``: an HF safetensors dir (``load_hf_weights_``); ``hf=False``: a refexp/DCP checkpoint
    (``load_model_weights``: an SFT output, a run's ``checkpoint/step-N``, or a run dir);
    ``hf=None``: decided by ``is_hf_dir(path)`` (config.json beside ``*.safetensors``) on rank 0, whose answer
    every rank follows (a shared filesystem can show ranks different ones: ``distributed.decided_by_rank0``).
    """
    if hf is None:
        hf = decided_by_rank0(lambda: is_hf_dir(path))
    if hf:
        load_hf_weights_(model, model_cfg, str(path))
    else:
        load_model_weights(model, path)
