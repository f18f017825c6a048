"""A sweep's runs kept beside its committed report as one archive, ``runs.tar.xz``, so the report re-renders under
later report code without hundreds of run dirs in the repo.

What a report reads of a run is text (``status.json``, ``metrics.jsonl``, ``eval_outcomes.jsonl``, ``samples.jsonl``,
the configs): per-prompt 0/1 scores and floats that xz packs several times smaller than git's zlib does. ``pack``
writes every file of the sweep dir except what a report never reads (checkpoints, W&B's offline files) and what it
writes itself (report.md, report.html, summary.json, report_plots/); ``runs_source`` extracts it into a temporary
dir for ``build_report`` to read, with ``tarfile``'s ``data`` filter (PEP 706): an archive is data, so a member that
is a link, a device, an absolute path or a path out of the dir is refused before anything is written.

    python -m refexp.report.pack_runs SWEEP_DIR OUT_DIR   # OUT_DIR/runs.tar.xz; then refexp-report OUT_DIR
"""

from __future__ import annotations

import contextlib
import tarfile
import tempfile
from pathlib import Path
from typing import Iterator

from refexp.report.reading.load import find_run_dirs

ARCHIVE = "runs.tar.xz"
SKIPPED_DIRS = {"checkpoint", "wandb", "report_plots"}
"""Never read by a report (checkpoints, W&B's offline run files) or written by it (its plots)."""
SKIPPED_FILES = {"report.md", "report.html", "summary.json", "wandb_id", ARCHIVE}


def _members(sweep_dir: Path) -> list[Path]:
    """Every file of the sweep dir a report reads, relative to it, in a stable order."""
    out = []
    for path in sorted(sweep_dir.rglob("*")):
        rel = path.relative_to(sweep_dir)
        if path.is_file() and not path.is_symlink() and rel.name not in SKIPPED_FILES \
                and not SKIPPED_DIRS & set(rel.parts[:-1]):
            out.append(rel)
    return out


def pack(sweep_dir: Path, out_dir: Path) -> Path:
    """``out_dir/runs.tar.xz`` of the sweep's files (module doc); raises ValueError when the sweep has no run."""
    sweep_dir, out_dir = Path(sweep_dir), Path(out_dir)
    if not find_run_dirs(sweep_dir):
        raise ValueError(f"{sweep_dir} holds no run dir (a run dir has .hydra/, status.json or metrics.jsonl)")
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / ARCHIVE
    partial = target.with_name(target.name + ".partial")
    with tarfile.open(partial, "w:xz", preset=9) as tar:
        for rel in _members(sweep_dir):
            info = tar.gettarinfo(str(sweep_dir / rel), arcname=rel.as_posix())
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0  # the same runs give the same archive
            with open(sweep_dir / rel, "rb") as f:
                tar.addfile(info, f)
    partial.replace(target)  # a crash mid-write leaves the previous archive whole
    return target


@contextlib.contextmanager
def runs_source(sweep_dir: Path) -> Iterator[Path]:
    """The dir a report reads its runs from: ``sweep_dir`` itself where it holds run dirs or has no archive; else
    a temporary dir holding its ``runs.tar.xz`` extracted (removed on exit). A member the ``data`` filter refuses
    raises ``tarfile.FilterError`` naming it, before the report reads anything."""
    sweep_dir = Path(sweep_dir)
    archive = sweep_dir / ARCHIVE
    if not archive.is_file() or find_run_dirs(sweep_dir):
        yield sweep_dir
        return
    with tempfile.TemporaryDirectory(prefix="refexp-runs-") as tmp:
        with tarfile.open(archive, "r:xz") as tar:
            tar.extractall(tmp, filter="data")
        yield Path(tmp)
