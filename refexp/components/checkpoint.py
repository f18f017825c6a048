"""Save and resume through torchtitan's ``CheckpointManager`` (DCP), including the reference strategy.

What a checkpoint holds: the policy (of a LoRA policy, ``model.lora``, only its adapters and its reference's
part: the frozen base is the start checkpoint's, pinned by its sha256), the optimizer (FQN-keyed, reshardable),
the LR schedule, and the extra ``Stateful`` objects the algorithm registers: ``train_state`` (step, data position,
KL controller) and ``reference`` (version, last update step, and the reference weights when the strategy moves
them). Sampling randomness is keyed to (seed, step, prompt, sample), so no RNG
state is needed for an exact resume.

Disk (launch/README.md, "Checkpoint size"): ``checkpoint.save_reference=false`` leaves a moving
reference's weights out, and a resume after the reference moved is then refused (``ReferenceState``);
``checkpoint.last_save_model_only=true`` makes the end-of-run checkpoint model-only, and a rerun resumes
from the newest full checkpoint before it (``Checkpointer.resume``).

Atomicity and verification: DCP writes ``.metadata`` last (through a temporary name and a rename),
then refexp writes a manifest of every file with its size and sha256 (refexp/record/checkpoints.py),
and only then prunes to ``keep_latest_k``. A resume walks the ``step-N`` folders from the newest down
and takes the first that verifies (``checkpoint.verify``); each one skipped is named in a warning. A
save that fails (a full disk) removes its half-written folder and raises its own error.

Model weights alone (the SFT output, a reference checkpoint) are written and read by
``refexp/titan/checkpoint_dirs.py`` (``save_model_weights``; ``load_weights`` for DCP or HF dirs); its
DCP helpers are re-exported here.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from refexp.components.run_identity import foreign_checkpoint
from refexp.config import CheckpointConfig, ConfigError
from refexp.record.checkpoints import (
    MANIFEST,
    checked_steps,
    complete_steps,
    has_manifest,
    manifest_run,
    write_manifest,
)
from refexp.runtime import distributed as rdist
from refexp.titan.dcp_reader import checked_dcp_metadata
from refexp.titan.lora import AdapterStates, has_adapters
from refexp.titan.optim_checkpoint import MODEL, CheckpointManager
from refexp.titan.unwrap import local_tensor


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
        return {k: v for k, v in self.strategy.state_dict().items() if k not in ("model", "master")}

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
    full one also holds refexp's ``train_state``. ``.metadata`` is read by the restricted unpickler: a
    crafted one is a ``ConfigError`` naming it (refexp/titan/dcp_reader.py)."""
    keys = checked_dcp_metadata(step_dir).state_dict_metadata
    return not any(k.startswith("train_state") for k in keys)




def _first_failure(e: BaseException) -> BaseException:
    """The error a save reports: DCP wraps each rank's in a ``CheckpointException``, a ``BaseException``
    that ``except Exception`` misses and whose type hides the cause (a full disk's ``OSError``); the
    lowest failing rank's own error is raised instead (the wrapper as its cause)."""
    from torch.distributed.checkpoint.api import CheckpointException

    if isinstance(e, CheckpointException) and e.failures:
        return e.failures[min(e.failures)][0]
    return e


class Checkpointer:
    """``CheckpointManager`` over ``<run_dir>/<checkpoint.folder>``; a no-op when ``checkpoint.enable=false``.
    Saves are verified by a manifest (``save``) and resumes by checking it (``resume``)."""

    def __init__(self, cfg: CheckpointConfig, run_dir: str | os.PathLike, *, model: torch.nn.Module,
                 optimizers, lr_schedulers, states: dict[str, Any], completed_at: int | None = None,
                 identity: dict | None = None) -> None:
        """``completed_at``: the end of the completed run the run dir held when this invocation started, if any
        (``RunContext.completed_at``): ``save`` keeps that run's checkpoints until this one passes it.
        ``identity``: this run's (``refexp/components/run_identity.py``), written into every manifest and checked
        against the checkpoint a resume chooses."""
        self.cfg, self.model = cfg, model
        self.identity = identity
        self.completed_at = completed_at
        self.folder = Path(run_dir) / cfg.folder
        self.checksums = cfg.verify == "checksum"
        self.last_good = -1  # the newest verified checkpoint: the one resumed from or saved last
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
        if cfg.enable and has_adapters(model):  # LoRA: the frozen base is the (pinned) start checkpoint's
            self.manager.states[MODEL] = AdapterStates(model, with_reference=cfg.save_reference)

    def _dir(self, step: int) -> Path:
        return self.folder / f"step-{step}"

    def resume(self) -> bool:
        """Load ``load_step``, else the newest checkpoint that verifies, of this run dir; False on a fresh
        start. Rank 0 verifies and chooses (its error, if any, is raised on every rank)."""
        if not self.cfg.enable:
            return False
        self._remove_incomplete()
        choice: int | None | ConfigError = None
        if rdist.is_rank0():
            try:
                choice = self._step_to_resume()
                problem = None if choice is None or self.identity is None else foreign_checkpoint(
                    manifest_run(self._dir(choice)), self.identity, self._dir(choice))
                if problem:
                    raise ConfigError(problem)
            except ConfigError as e:
                choice = e
        choice = rdist.broadcast_object(choice)
        if isinstance(choice, ConfigError):
            raise choice
        if choice is None or not self.manager.load(step=choice):
            return False
        if not has_manifest(self._dir(choice)):  # written before manifests: only its sizes were checked
            self._refuse_non_finite(choice)
        self.last_good = choice
        return True

    def _refuse_non_finite(self, step: int) -> None:
        """``ConfigError`` on every rank, naming the checkpoint, when the unverified ``step-N`` just loaded gave
        the model a non-finite weight: bytes damaged in place, which its sizes cannot show, would otherwise end
        the run at its first update with a NonFiniteError that names no file."""
        bad = next((name for name, t in self.model.state_dict().items()
                    if t.is_floating_point() and not torch.isfinite(local_tensor(t)).all()), None)
        device = next((p.device for p in self.model.parameters()), torch.device("cpu"))
        if rdist.any_rank(bad is not None, device):
            where = f" ({bad})" if bad else " (on another rank)"
            raise ConfigError(f"checkpoint {self._dir(step)} (no {MANIFEST}: written before manifests, unverified) "
                              f"loaded non-finite weights{where}: its files are damaged. Move it away to resume "
                              f"from the checkpoint before it")

    def _step_to_resume(self) -> int | None:
        """``load_step`` (an error unless it verifies), else the newest full checkpoint that verifies (a
        model-only final save cannot restore the optimizer, the reference or the counters); None on a
        fresh start (no complete ``step-N``). Checkpoints that all fail verification are an error, not a
        fresh start: starting over would rewrite the run's record from step 0."""
        if self.cfg.load_step >= 0:
            return self._load_step()
        skipped, model_only = [], []
        for step, problem in checked_steps(self.folder, checksums=self.checksums):
            if problem is not None:
                skipped.append(f"step-{step}: {problem}")
            elif is_model_only(self._dir(step)):
                model_only.append(step)
            else:
                return step
        if model_only:
            raise ConfigError(f"{self.folder} holds only a model-only checkpoint (step-{model_only[0]}, "
                              f"checkpoint.last_save_model_only=true): the run cannot be resumed or continued. "
                              f"Its final weights load as a start (checkpoint.initial_load_path) of a new run_dir")
        if skipped:
            raise ConfigError(f"no checkpoint of run_dir={str(self.folder.parent)!r} verifies ({'; '.join(skipped)}): "
                              f"the run cannot resume, and starting over would rewrite its record. Move "
                              f"{self.folder} away to start it again from step 0")
        return None

    def _load_step(self) -> int:
        """``checkpoint.load_step``, refused with a one-line error unless it is complete, verifies and is full."""
        step = self.cfg.load_step
        problem = next((p for s, p in checked_steps(self.folder, checksums=self.checksums) if s == step),
                       f"no complete step-{step} (complete: {complete_steps(self.folder) or 'none'})")
        if problem is not None:
            raise ConfigError(f"checkpoint.load_step={step} is invalid: {self._dir(step)} cannot be loaded: {problem}")
        if is_model_only(self._dir(step)):
            raise ConfigError(f"checkpoint.load_step={step}: step-{step} in {self.folder} holds model weights "
                              f"only (checkpoint.last_save_model_only) and cannot be resumed")
        return step

    def _remove_incomplete(self) -> None:
        """Delete ``step-N`` folders without DCP ``.metadata`` (a save killed half way). They are never
        loaded, but torchtitan's ``keep_latest_k`` counts them, and could prune a good checkpoint
        instead of a broken one with a higher step."""
        if self.folder.is_dir() and rdist.is_rank0():
            for p in self.folder.iterdir():
                if re.fullmatch(r"step-\d+", p.name) and p.is_dir() and not (p / ".metadata").is_file():
                    shutil.rmtree(p, ignore_errors=True)
        rdist.barrier()

    def save(self, step: int, *, force: bool = False, final: bool = False) -> bool:
        """Save at the configured interval, or now when ``force`` (preemption) or ``final`` (the end of the
        run: model weights only with ``checkpoint.last_save_model_only``; a preemption's save stays full).

        Then, once every rank's files are written, rank 0 writes the manifest, and only then are older
        checkpoints pruned. A save that raises (a full disk) removes its ``step-N`` folder and re-raises.
        """
        if not self.cfg.enable or not self.manager._should_save(step, force or final):
            return False
        if self._keeps_completed_run(step):
            return False
        self.manager.last_save_model_only = final and self.cfg.last_save_model_only
        step_dir = self._dir(step)
        if rdist.is_rank0() and step_dir.exists():  # one that failed verification: no stale file may stay
            shutil.rmtree(step_dir)
        rdist.barrier()
        try:
            self.manager.save(step, last_step=force or final)
            self.manager.maybe_wait_for_saving()
            rdist.barrier()  # every rank's shards are on disk before rank 0 lists them
            if rdist.is_rank0():
                write_manifest(step_dir, checksums=self.checksums, run=self.identity)
        except BaseException as e:
            if rdist.is_rank0():
                shutil.rmtree(step_dir, ignore_errors=True)
            cause = _first_failure(e)
            if cause is e:
                raise
            raise cause from e
        self.manager.purge_stale_checkpoints()
        self.last_good = step
        return True

    def _keeps_completed_run(self, step: int) -> bool:
        """Whether a save of ``step`` is skipped: a rerun of a run completed at ``completed_at`` that has not passed
        it writes no checkpoint at or before the folder's newest one, which would replace (or, by pruning, remove)
        that run's own (``refexp/record/rerun.py``). Rank 0 decides: the save is a collective."""
        if self.completed_at is None or step > self.completed_at:
            return False
        return rdist.decided_by_rank0(lambda: step <= max(complete_steps(self.folder), default=-1))

    def latest_step(self) -> int:
        """The newest verified checkpoint of this run: the one it resumed from or saved last (-1: none)."""
        return self.last_good

    def close(self) -> None:
        if self.cfg.enable:
            self.manager.close()
