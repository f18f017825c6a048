"""The checks a rerun of a run dir passes before anything is built or written: a run dir that holds a run is
resumed, so the rerun's config may differ only where a resume allows, and it may not end before the step that
run reached (``refexp/run.py``'s ``validate``)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from refexp.config import ConfigError, RootConfig
from refexp.config.diff import RESUMABLE_CHANGES, changed_fields
from refexp.record.resolved_config import read_resolved_config
from refexp.record.status import read_status


def resolved_container(dcfg: DictConfig) -> dict:
    """``dcfg`` as plain containers, interpolations resolved (what ``resolved_config.yaml`` records)."""
    return OmegaConf.to_container(dcfg, resolve=True, throw_on_missing=False)


def check_rerun_config(dcfg: DictConfig, run_dir: Path) -> None:
    """A run dir that holds a run (its ``resolved_config.yaml``) is resumed, so the rerun's config must
    be that run's up to ``RESUMABLE_CHANGES`` (refexp/config/diff.py); checked before any model is built
    and before ``run_worker`` writes the new config over the old."""
    old = read_resolved_config(run_dir)
    if old is None:
        return
    changed = changed_fields(old, resolved_container(dcfg))
    if changed:
        fields = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
        raise ConfigError(f"run_dir={str(run_dir)!r} holds a run with another configuration, and rerunning a "
                          f"run dir resumes it. Changed: {fields}. Use a new run_dir (a rerun may change only "
                          f"{', '.join(RESUMABLE_CHANGES)})")


def check_rerun_steps(cfg: RootConfig, run_dir: Path) -> None:
    """A rerun with fewer ``training.steps`` than the run dir's run has reached is refused: it cannot resume
    (its LR schedule would end before the checkpoint's step) and must not touch that run's record."""
    earlier = read_status(run_dir) or {}
    heartbeat = earlier.get("heartbeat") if isinstance(earlier.get("heartbeat"), dict) else {}
    reached = max(_recorded_step(run_dir, "last_step", earlier.get("last_step")),
                  _recorded_step(run_dir, "heartbeat.step", heartbeat.get("step")))
    if cfg.algo.name not in ("sft", "rm") and reached > cfg.training.steps:  # sft's and rm's steps are their stage's
        done = "completed" if earlier.get("status") == "completed" else "reached"
        raise ConfigError(f"run_dir={str(run_dir)!r} holds a run that {done} {reached} steps, and rerunning a run "
                          f"dir resumes it: training.steps={cfg.training.steps} is fewer. To continue it use "
                          f"training.steps >= {reached}, or use a new run_dir")


def _recorded_step(run_dir: Path, field: str, value) -> int:
    """A step count read from the run dir's status.json; a value that is not a whole number (a hand edit, a
    damaged record) is refused in one line rather than guessed at, since the rerun guard above depends on it."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float, str)) or not str(value).strip().isdigit():
        raise ConfigError(f"{run_dir / 'status.json'}: {field} is {value!r}, not a step count (a whole number "
                          f">= 0): the record is damaged; use a new run_dir, or repair or remove that file")
    return int(str(value).strip())
