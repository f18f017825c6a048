"""A model directory a run starts from, pinned by content: the sha256 of its weight files.

A run's start (the SFT model, ``checkpoint.initial_load_path``, ``reference.checkpoint``) and its reward models
are found by path or cache key, and what lies there can change between two invocations of one run (another
``sft.cache_dir`` whose entry under the same key holds another model, a re-export). The pins are recorded in the
run's checkpoints (``refexp/components/run_identity.py``) and its ``status.json``; a resume onto other weights is
refused.

Only weight files count (``weight_files``): the files of the format a load reads the dir as (``is_hf_dir`` decides
for the pin and for ``refexp/titan/checkpoint_dirs.py``'s ``load_weights`` alike, so the pin covers what is loaded;
``checkpoint.initial_load_in_hf`` makes the loader read its dir as HF whatever it holds, and that pin follows):
an HF dir's safetensors / bin / pt files, else a DCP dir's ``.metadata`` and shards, sizes and names included;
tokenizers, configs and logs do not. Hashing reads every byte once per invocation (~1.2 GB/s per core, files in
parallel threads).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Mapping, Optional

from refexp.record.checkpoints import checksums_of

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".distcp")
DCP_METADATA = ".metadata"


def is_hf_dir(path: str | Path) -> bool:
    """An HF checkpoint dir: config.json beside safetensors weights. ``load_weights`` reads such a dir with the HF
    reader, whatever else it holds (an SFT output's ``model/`` included)."""
    p = Path(path)
    return (p / "config.json").is_file() and any(p.glob("*.safetensors"))


def weight_files(model_dir: str | Path, read_as_hf: bool = False) -> list[Path]:
    """The files whose bytes are the weights a load reads, sorted: an SFT output's ``model/`` (DCP), a DCP dir's own
    files, else every file with a ``WEIGHT_SUFFIXES`` suffix below ``model_dir``; an HF dir (``is_hf_dir``, which the
    loader reads as HF whatever else it holds) or one the loader is told to read as HF (``read_as_hf``: its
    safetensors, whatever DCP files lie beside them) always the latter."""
    d = Path(model_dir)
    if not read_as_hf and not is_hf_dir(d):
        if (d / "model" / DCP_METADATA).is_file():
            d = d / "model"
        if (d / DCP_METADATA).is_file():
            return sorted(p for p in d.iterdir() if p.is_file() and (p.name == DCP_METADATA or p.suffix == ".distcp"))
    return sorted(p for p in d.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES)


def content_hash(model_dir: str | Path, read_as_hf: bool = False) -> Optional[str]:
    """The sha256 (hex) over each weight file's path relative to ``model_dir``, size and sha256; None when
    ``model_dir`` holds no weight file (a Hub id, a missing dir). ``read_as_hf``: as ``weight_files``."""
    d = Path(model_dir)
    files = weight_files(d, read_as_hf) if d.is_dir() else []
    if not files:
        return None
    h = hashlib.sha256()
    for p, digest in zip(files, checksums_of(files)):
        h.update(f"{p.relative_to(d).as_posix()}\t{p.stat().st_size}\t{digest}\n".encode())
    return h.hexdigest()


def pin(model_dir: str | Path, read_as_hf: bool = False) -> dict:
    """``{path, sha256}`` of a model dir (``sha256`` None when it holds no weight file); ``read_as_hf``: the loader
    reads it as HF whatever it holds (``checkpoint.initial_load_in_hf``)."""
    return {"path": str(Path(model_dir).resolve()) if Path(model_dir).exists() else str(model_dir),
            "sha256": content_hash(model_dir, read_as_hf)}


def pin_mismatch(recorded: Mapping, current: Mapping) -> Optional[str]:
    """None when every model both ``{role: pin}`` maps name has the same ``sha256``; else one line naming the first
    role whose weights differ, the model recorded and the one found now."""
    for role, now in current.items():
        then = recorded.get(role)
        if not isinstance(then, Mapping) or then.get("sha256") is None or now.get("sha256") is None:
            continue  # recorded before pins, or not a local dir
        if then["sha256"] != now["sha256"]:
            return (f"the {role} this run began from is {then.get('path')} (weights sha256 {then['sha256'][:16]}), "
                    f"and it is now {now.get('path')} (weights sha256 {now['sha256'][:16]}): other weights")
    return None
