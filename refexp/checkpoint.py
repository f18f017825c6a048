"""Save and resume through torchtitan's ``CheckpointManager`` (DCP), including the reference strategy.

What a checkpoint holds: the policy, the optimizer (FQN-keyed, reshardable), the LR schedule, and
the extra ``Stateful`` objects the algorithm registers: ``train_state`` (step, data position, KL
controller) and ``reference`` (version, last update step, and the reference weights when the
strategy moves them). Sampling randomness is keyed to (seed, step, prompt, sample), so no RNG
state is needed for an exact resume.

Atomicity: DCP writes ``.metadata`` last (through a temporary name and a rename), and torchtitan
only resumes from ``step-N`` folders that have it, so a kill during a save leaves the previous
checkpoint in charge. ``keep_latest_k`` prunes older folders.

Model weights alone (the SFT output, a reference checkpoint) are written and read by
``refexp/titan/weights.py`` (``save_model_weights``; ``load_weights`` for DCP or HF dirs); its
DCP helpers are re-exported here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

from refexp.config import CheckpointConfig
from refexp.titan.components import CheckpointManager
from refexp.titan.weights import latest_checkpoint_step


class TrainState:
    """Counters of the loop, as a torch ``Stateful``."""

    def __init__(self) -> None:
        self.step = 0
        self.extra: dict[str, Any] = {}

    def state_dict(self) -> dict:
        return {"step": torch.tensor(self.step), "extra": dict(self.extra)}

    def load_state_dict(self, sd: dict) -> None:
        self.step = int(sd["step"])
        self.extra = dict(sd.get("extra", {}))


class Checkpointer:
    """``CheckpointManager`` over ``<run_dir>/<checkpoint.folder>``; a no-op when ``checkpoint.enable=false``."""

    def __init__(self, cfg: CheckpointConfig, run_dir: str | os.PathLike, *, model: torch.nn.Module,
                 optimizers, lr_schedulers, states: dict[str, Any]) -> None:
        self.cfg = cfg
        self.folder = Path(run_dir) / cfg.folder
        tt_cfg = CheckpointManager.Config(
            enable=cfg.enable,
            folder=cfg.folder,
            interval=cfg.interval,
            keep_latest_k=cfg.keep_latest_k,
            async_mode=cfg.async_mode,
            last_save_model_only=False,  # the end of a run must stay resumable (training.steps may grow)
            load_step=cfg.load_step,
            # refexp loads the start weights itself (SFT output / HF dir); this manager only resumes
            initial_load_model_only=False,
        )
        self.manager = CheckpointManager(
            tt_cfg,
            dataloader=None,
            model_parts=[model],
            optimizers=optimizers,
            lr_schedulers=lr_schedulers,
            states=states,
            sd_adapter=None,
            base_folder=str(run_dir),
        )

    def resume(self) -> bool:
        """Load the latest (or ``load_step``) checkpoint of this run dir; False on a fresh start."""
        if not self.cfg.enable:
            return False
        self._remove_incomplete()
        return bool(self.manager.load(step=self.cfg.load_step))

    def _remove_incomplete(self) -> None:
        """Delete ``step-N`` folders without DCP ``.metadata`` (a save killed half way). They are never
        loaded, but torchtitan's ``keep_latest_k`` counts them, and could prune a good checkpoint
        instead of a broken one with a higher step."""
        import shutil

        import torch.distributed as dist

        if self.folder.is_dir() and dist.get_rank() == 0:
            for p in self.folder.iterdir():
                if re.fullmatch(r"step-\d+", p.name) and p.is_dir() and not (p / ".metadata").is_file():
                    shutil.rmtree(p, ignore_errors=True)
        if dist.get_world_size() > 1:
            dist.barrier()

    def save(self, step: int, *, force: bool = False) -> bool:
        """Save at the configured interval, or now when ``force`` (end of run, preemption)."""
        if not self.cfg.enable:
            return False
        saved = self.manager.save(step, last_step=force)
        self.manager.maybe_wait_for_saving()
        if saved and force:
            self.manager._purge_stale_checkpoints()  # torchtitan prunes after interval saves only
        return saved

    def latest_step(self) -> int:
        return latest_checkpoint_step(self.folder)

    def close(self) -> None:
        if self.cfg.enable:
            self.manager.close()
