"""Where an invocation writes the run's record: the run dir, or a scratch copy while a rerun of a completed
run has not advanced past that run's end.

A rerun of a completed run resumes from a checkpoint at or before the recorded end (``checkpoint.load_step``,
a deleted or pruned ``checkpoint/``, checkpointing off: from step 0), truncates what follows it and logs those
steps again. Done in the run dir, an interruption would leave the completed run's record cut short. So until the
rerun logs a step past the recorded end, its record files (``RECORD_FILES``) and its status go to
``<run_dir>/.rerun/``, a copy of the run dir's, and the run dir is not written. The first step past the end
promotes the copy (``RerunRecord.promote``): the run dir's status becomes this invocation's ``running`` one
first (so that a kill in the middle leaves a run that is running, hence resumable from its newest checkpoint,
never a ``completed`` one with another run's rows), then each copied file replaces its original. A rerun that
ends without passing the end (completed, stopped or failed) removes the copy: the run dir is as it was.

``.hydra/`` too: the rerun's Hydra record (``refexp/record/hydra_record.py``) waits in ``<run_dir>/.rerun/.hydra``
(``pending_hydra_dir``), since the rerun's command may spell the job's overrides another way (``training.lr=1e-3``
for the sweep's ``0.001``) or extend it (``training.steps``): the promotion moves it into ``.hydra/``, a rerun that
does not pass the end removes it with the copy. docs/runs.md, "Rerunning a completed run".
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable, Optional

from refexp.record import layout

RECORD_FILES = (layout.RESOLVED_CONFIG, layout.SAMPLES, layout.EVAL_OUTCOMES, layout.METRICS)
"""What a rerun writes to the copy (``metrics.jsonl`` last: a reader that sees its new rows sees the rest)."""


def pending_hydra_dir(run_dir: str | Path) -> Path:
    """Where a rerun of a completed run writes its ``.hydra/`` until it passes that run's end."""
    return layout.path(run_dir, layout.RERUN_DIR) / layout.HYDRA_DIR


class RerunRecord:
    """The record's directory for this invocation (``dir``): ``<run_dir>/.rerun`` while ``protected`` (the run
    dir holds a run completed at step ``completed_at`` and no step after it was logged yet), else the run dir.

    ``on_promote()`` runs first when the copy is promoted: it writes this invocation's ``running`` status to the
    run dir."""

    def __init__(self, run_dir: str | Path, completed_at: Optional[int], *, enabled: bool = True,
                 on_promote: Callable[[], None] = lambda: None) -> None:
        self.run_dir = Path(run_dir)
        self.completed_at = completed_at
        self.on_promote = on_promote
        self.scratch = layout.path(run_dir, layout.RERUN_DIR)
        self.protected = completed_at is not None
        if enabled:  # a killed rerun's: this one copies the record again (its own pending .hydra stays)
            _clear(self.scratch, keep=layout.HYDRA_DIR if self.protected else None)
        if enabled and self.protected:
            self.scratch.mkdir(parents=True, exist_ok=True)
            for name in RECORD_FILES:
                if layout.path(run_dir, name).is_file():
                    shutil.copyfile(layout.path(run_dir, name), self.scratch / name)

    @property
    def dir(self) -> Path:
        return self.scratch if self.protected else self.run_dir

    def before_log(self, step: int) -> bool:
        """Called before a row of ``step`` is written: promotes the copy when ``step`` is past the completed end.
        Returns whether it did (the caller reopens its files in the run dir)."""
        if self.protected and step > self.completed_at:
            self.promote()
            return True
        return False

    def promote(self) -> None:
        """The copy becomes the run's record: status first (``on_promote``), then the pending ``.hydra/`` files,
        then each record file, then the copy goes."""
        self.on_promote()
        pending = pending_hydra_dir(self.run_dir)
        if pending.is_dir():
            hydra = layout.path(self.run_dir, layout.HYDRA_DIR)
            hydra.mkdir(exist_ok=True)
            for src in sorted(pending.iterdir()):
                os.replace(src, hydra / src.name)
        for name in RECORD_FILES:
            src = self.scratch / name
            if src.is_file():
                os.replace(src, layout.path(self.run_dir, name))
        self.protected = False
        shutil.rmtree(self.scratch, ignore_errors=True)

    def discard(self) -> None:
        """The end of an invocation that did not pass the completed end: the copy goes, the run dir is as it was."""
        if self.protected:
            shutil.rmtree(self.scratch, ignore_errors=True)


def _clear(scratch: Path, keep: str | None) -> None:
    """``scratch`` removed, but for its entry ``keep``."""
    if keep is None or not (scratch / keep).exists():
        shutil.rmtree(scratch, ignore_errors=True)
        return
    for p in scratch.iterdir():
        if p.name == keep:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def completed_end(earlier: dict) -> Optional[int]:
    """The last step of the run a run dir's earlier status (``earlier``) records as completed, else None."""
    if earlier.get("status") != "completed":
        return None
    try:
        return int(earlier.get("last_step") or 0)
    except (TypeError, ValueError):
        return 0
