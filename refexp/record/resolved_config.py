"""``resolved_config.yaml``: the configuration a run used, interpolations resolved. Rank 0 writes it at the
start of every invocation; a rerun of the run dir is checked against it (``refexp/run.py``), and the report
reads the run's settings from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from omegaconf import OmegaConf

from refexp.record import layout
from refexp.record.atomic import write_text_atomic


def write_resolved_config(run_dir: str | Path, config: dict) -> None:
    """``config`` (a plain container) as YAML, atomically (OmegaConf's ``save`` format)."""
    write_text_atomic(layout.path(run_dir, layout.RESOLVED_CONFIG), OmegaConf.to_yaml(OmegaConf.create(config)),
                      encoding="utf-8")


def read_resolved_config(run_dir: str | Path) -> Optional[dict]:
    """The run's resolved config as plain Python, or None when the run dir has none (or a broken one)."""
    p = layout.path(run_dir, layout.RESOLVED_CONFIG)
    if not p.is_file():
        return None
    try:
        out = OmegaConf.to_container(OmegaConf.load(p), resolve=False)
    except Exception:  # any YAML or OmegaConf error: the report never raises on a broken run dir
        return None
    return out if isinstance(out, dict) else None
