"""What a made SFT start is worth as a start: whether the stage converged, and whether it lies in the band a
converged start of its task reaches. Both go into ``sft.json``, are printed with the start, and reach the run's
``status.json`` (``sft_start``) and the report's setup block, so a start that is not what the comparison assumes
is said, not silently used.

Replicate starts (``sft.seed``) are exchangeable only when each one learned what the demonstrations teach; a
start stopped by the step cap while its validation loss still fell is a point on a learning curve instead, and
where on that curve depends on the machine's rounding (docs/headroom-task.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

START_BAND = 0.05
"""How far below what imitating the demonstrations allows (``imitation_ceiling``) a converged start's validation
accuracy may lie."""
RETENTION_FLOOR = 0.9
"""The least ``eval/retention`` a converged start of the headroom task has: the skills RL does not train are
demonstrated without slips."""


def converged(stopped_by: str, *, has_val: bool, patience: int) -> Optional[bool]:
    """Whether the stage ended at convergence: the target accuracy or the validation plateau (True); the step cap
    (False): validation loss had fallen by ``sft.min_delta`` within the last ``sft.patience`` evaluations, or
    validation accuracy was still below the floor a converged model of the task reaches (``ValidationStop``);
    None when no rule could tell (no validation split, ``sft.patience=0``)."""
    if stopped_by in ("target", "plateau"):
        return True
    return False if has_val and patience > 0 else None


def start_warnings(summary: dict, *, ceiling: Optional[float], steps_cap: int) -> list[str]:
    """One line per way the start ``summary`` (``sft.json``'s fields) falls short of a converged start of its task;
    ``ceiling``: the validation accuracy imitating the demonstrations allows (None where the task has no such
    number)."""
    out = []
    if summary.get("converged") is False:
        out.append(f"SFT start not converged: stopped by the sft.steps={steps_cap} cap before a stop rule ended it "
                   f"(best validation loss at step {summary.get('kept_step')}); raise sft.steps")
    val = summary.get("val_accuracy")
    if ceiling is not None and val is not None and val < ceiling - START_BAND:
        out.append(f"SFT start outside its band: validation accuracy {val:.3f}, below {ceiling - START_BAND:.3f} "
                   f"(what imitating the demonstrations allows, {ceiling:.3f}, less {START_BAND})")
    retention = summary.get("eval_retention")
    if ceiling is not None and retention is not None and retention < RETENTION_FLOOR:
        out.append(f"SFT start outside its band: retention {retention:.3f}, below {RETENTION_FLOOR}")
    return out


def sft_start_record(sft_dir: Path, summary: dict, sha256: Optional[str] = None) -> dict:
    """What ``status.json`` says of the run's start (``RunStatus.sft_start``): the directory's name, the sha256 of
    its weights (``refexp/record/pins.py``) and, for an SFT stage's output, the accuracies its ``sft.json``
    (``summary``) recorded, whether it converged and what falls short of a converged start (``converged``,
    ``start_warnings``)."""
    return {"key": sft_dir.name, "sha256": sha256, "val_accuracy": summary.get("val_accuracy"),
            "eval_accuracy": summary.get("eval_accuracy"), "converged": summary.get("converged"),
            "warnings": list(summary.get("warnings") or [])}
