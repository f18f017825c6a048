"""Which run a checkpoint belongs to: recorded in every ``step-N`` manifest (``refexp/record/checkpoints.py``) and
checked before a resume loads it (``refexp/components/checkpoint.py``).

A run's identity: its run dir, its resolved config (compared as a rerun's is, ``refexp/config/diff.py``: fields a
resume may change and fields only one side has are left out, paths into the cache dir relative to it), a short
hash of the fields that define it, and the pins of the models it started from (``refexp/record/pins.py``). A
checkpoint of another configuration, or trained from other start weights, is refused in one line naming both; one
written in another run dir with the same configuration (a run dir moved or copied) is resumed with a warning. A
checkpoint written before checkpoints named their run is resumed as before.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Mapping, Optional

from refexp.config.diff import _resumable, changed_fields, comparable
from refexp.record.hashing import stable_hash
from refexp.record.pins import pin, pin_mismatch


def run_identity(resolved: Mapping, run_dir: str | Path, pins: Optional[Mapping] = None) -> dict:
    """``{run_dir, config_hash, config, pins}`` of a run: ``resolved`` its resolved config (plain containers),
    ``pins`` ``{role: {path, sha256}}`` of its start and reward models."""
    defining = {k: v for k, v in comparable(resolved).items() if not _resumable(k)}  # the same from a copied cache
    return {"run_dir": str(Path(run_dir).resolve()), "config_hash": stable_hash(defining, 12),
            "config": dict(resolved), "pins": dict(pins or {})}


def foreign_checkpoint(recorded: Optional[Mapping], current: Mapping, step_dir: str | Path) -> Optional[str]:
    """None when ``step_dir``, whose manifest recorded ``recorded`` (None: a checkpoint from before identities), may
    be resumed by the run ``current``; else the one-line reason it is another run's."""
    if not isinstance(recorded, Mapping):
        return None
    theirs = f"run_dir={recorded.get('run_dir')!r} (config {recorded.get('config_hash')})"
    ours = f"run_dir={current['run_dir']!r} (config {current['config_hash']})"
    changed = changed_fields(recorded.get("config") or {}, current["config"])
    if changed:
        fields = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in list(changed.items())[:5])
        more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
        return (f"checkpoint {step_dir} belongs to another run: it was written by {theirs}, this is {ours}; they "
                f"differ in {fields}{more}. Resume that run in its own run_dir, or give this run a checkpoint.folder "
                f"of its own")
    problem = pin_mismatch(recorded.get("pins") or {}, current.get("pins") or {})
    if problem:
        return (f"checkpoint {step_dir} cannot be resumed: {problem}. Resume with the models the run began from "
                f"(the sft.cache_dir or paths it used), or start again in a new run_dir")
    if recorded.get("run_dir") != current["run_dir"]:
        warnings.warn(f"[refexp] resuming checkpoint {step_dir}, written by {theirs}, in {ours}: the same "
                      f"configuration (a run dir moved or copied)", stacklevel=2)
    return None


START = "start model"
"""The pin (``refexp/record/pins.py``) of the model every algorithm starts from (``ensure_sft``'s dir)."""


def start_pins(cfg, sft_dir: Path) -> dict:
    """``{role: pin}`` of the models the run (``cfg``, its RootConfig) starts from: ``sft_dir`` and, when set,
    ``checkpoint.initial_load_path`` and ``reference.checkpoint`` (``foreign_checkpoint`` checks them at a resume),
    each pinned by the files its loader reads (``checkpoint.initial_load_in_hf``: ``initial_load_path`` as HF)."""
    pins = {START: pin(sft_dir)}
    for role, path, read_as_hf in (
            ("checkpoint.initial_load_path", cfg.checkpoint.initial_load_path, cfg.checkpoint.initial_load_in_hf),
            ("reference.checkpoint", getattr(cfg.reference, "checkpoint", None), False)):
        if path:
            pins[role] = pin(path, read_as_hf)
    return pins
