"""Save and resume through torchtitan's ``CheckpointManager`` (DCP), including the reference strategy.

What a checkpoint holds: the policy, the optimizer (FQN-keyed, reshardable), the LR schedule, and
the extra ``Stateful`` objects the algorithm registers: ``train_state`` (step, data position, KL
controller) and ``reference`` (version, last update step, and the reference weights when the
strategy moves them). Sampling randomness is keyed to (seed, step, prompt, sample), so no RNG
state is needed for an exact resume.

Disk (launch/README.md, "Checkpoint size"): ``checkpoint.save_reference=false`` leaves a moving
reference's weights out, and a resume after the reference moved is then refused (``ReferenceState``);
``checkpoint.last_save_model_only=true`` makes the end-of-run checkpoint model-only, and a rerun resumes
from the newest full checkpoint before it (``Checkpointer.resume``).

Atomicity: DCP writes ``.metadata`` last (through a temporary name and a rename), and torchtitan
only resumes from ``step-N`` folders that have it, so a kill during a save leaves the previous
checkpoint in charge. ``keep_latest_k`` prunes older folders.

Model weights alone (the SFT output, a reference checkpoint) are written and read by
``refexp/titan/checkpoint_dirs.py`` (``save_model_weights``; ``load_weights`` for DCP or HF dirs); its
DCP helpers are re-exported here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

from refexp.config import CheckpointConfig, ConfigError
from refexp.titan.components import CheckpointManager
from refexp.titan.checkpoint_dirs import latest_checkpoint_step


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


class ReferenceState:
    """The reference strategy as checkpointed when ``checkpoint.save_reference=false``: its counters
    without its weights. A moving reference that has moved since the start cannot be rebuilt from
    them, so loading such a state is refused rather than resuming against the start weights."""

    def __init__(self, strategy) -> None:
        self.strategy = strategy

    def state_dict(self) -> dict:
        return {k: v for k, v in self.strategy.state_dict().items() if k != "model"}

    def load_state_dict(self, sd: dict) -> None:
        version = int(sd["version"])
        if self.strategy.moves and version > 0:
            raise ConfigError(
                f"checkpoint.save_reference=false: reference={self.strategy.name} moved (version {version}, last "
                f"at step {int(sd['last_update_step'])}) and its weights are not in the checkpoint, so this run "
                f"cannot resume exactly. Start it again in a new run_dir (with checkpoint.save_reference=true to "
                f"make it resumable)")
        self.strategy.load_state_dict(sd)


def is_model_only(step_dir: str | os.PathLike) -> bool:
    """Whether a DCP checkpoint holds model weights only (torchtitan's ``last_save_model_only``): a
    full one also holds refexp's ``train_state``."""
    from torch.distributed.checkpoint import FileSystemReader

    keys = FileSystemReader(str(step_dir)).read_metadata().state_dict_metadata
    return not any(k.startswith("train_state") for k in keys)


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
            last_save_model_only=cfg.last_save_model_only,  # for the final save only (``save``)
            load_step=cfg.load_step,
            # refexp loads the start weights itself (SFT output / HF dir); this manager only resumes
            initial_load_model_only=False,
        )
        if not cfg.save_reference and "reference" in states:
            states = {**states, "reference": ReferenceState(states["reference"])}
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
        step = self._step_to_resume()
        return step is not None and bool(self.manager.load(step=step))

    def _complete_steps(self) -> list[int]:
        if not self.folder.is_dir():
            return []
        return sorted(int(p.name[5:]) for p in self.folder.iterdir()
                      if re.fullmatch(r"step-\d+", p.name) and (p / ".metadata").is_file())

    def _step_to_resume(self) -> int | None:
        """``load_step``, else the newest full checkpoint (a model-only final save cannot restore the
        optimizer, the reference or the counters); None on a fresh start."""
        steps = self._complete_steps()
        if self.cfg.load_step >= 0:
            if self.cfg.load_step in steps and is_model_only(self.folder / f"step-{self.cfg.load_step}"):
                raise ConfigError(f"checkpoint.load_step={self.cfg.load_step}: step-{self.cfg.load_step} in "
                                  f"{self.folder} holds model weights only (checkpoint.last_save_model_only) "
                                  f"and cannot be resumed")
            return self.cfg.load_step
        full = [s for s in steps if not is_model_only(self.folder / f"step-{s}")]
        if full:
            return full[-1]
        if steps:
            raise ConfigError(f"{self.folder} holds only a model-only checkpoint (step-{steps[-1]}, "
                              f"checkpoint.last_save_model_only=true): the run cannot be resumed or continued. "
                              f"Its final weights load as a start (checkpoint.initial_load_path) of a new run_dir")
        return None

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

    def save(self, step: int, *, force: bool = False, final: bool = False) -> bool:
        """Save at the configured interval, or now when ``force`` (preemption) or ``final`` (the end of the
        run: model weights only with ``checkpoint.last_save_model_only``; a preemption's save stays full)."""
        if not self.cfg.enable:
            return False
        self.manager.last_save_model_only = final and self.cfg.last_save_model_only
        saved = self.manager.save(step, last_step=force or final)
        self.manager.maybe_wait_for_saving()
        if saved and (force or final):
            self.manager._purge_stale_checkpoints()  # torchtitan prunes after interval saves only
        return saved

    def latest_step(self) -> int:
        return latest_checkpoint_step(self.folder)

    def close(self) -> None:
        if self.cfg.enable:
            self.manager.close()
