"""A sweep's runs kept beside its committed report as one archive, ``runs.tar.xz``, so the report re-renders under
later report code without hundreds of run dirs in the repo.

What a report reads of a run is text (``status.json``, ``metrics.jsonl``, ``eval_outcomes.jsonl``, ``samples.jsonl``,
the configs): per-prompt 0/1 scores and floats that xz packs several times smaller than git's zlib does. ``pack``
writes every file of the sweep dir except what a report never reads (checkpoints, W&B's offline files) and what it
writes itself (report.md, report.html, summary.json, report_plots/); ``runs_source`` extracts it into a temporary
dir for ``build_report`` to read, with ``tarfile``'s ``data`` filter (PEP 706): an archive is data, so a member that
is a link, a device, an absolute path or a path out of the dir is refused before anything is written. What it extracts
is capped (``MAX_MEMBER_BYTES`` a member; in all ``MAX_TOTAL_BYTES``, and ``MAX_RATIO`` times the archive's own size
past ``RATIO_FLOOR``), so a small archive cannot fill the disk; any of these, a file that is no xz tar or one cut
short is one ``ArchiveError`` line naming the archive. Where run dirs sit beside the archive, the run dirs are read and
the archive is not: they are what a sweep writes, the archive a copy of them made for the repo (a stale one, when
runs were added or removed since it was packed).

    python -m refexp.report.pack_runs SWEEP_DIR OUT_DIR   # OUT_DIR/runs.tar.xz; then refexp-report OUT_DIR
"""

from __future__ import annotations

import contextlib
import lzma
import tarfile
import tempfile
from pathlib import Path
from typing import Iterator

from refexp.report.reading.load import find_run_dirs

ARCHIVE = "runs.tar.xz"
SKIPPED_DIRS = {"checkpoint", "wandb", "report_plots"}
"""Never read by a report (checkpoints, W&B's offline run files) or written by it (its plots)."""
SKIPPED_FILES = {"report.md", "report.html", "summary.json", "wandb_id", ARCHIVE}
MAX_MEMBER_BYTES = 64 * 2**20
"""The largest file extracted: a run's largest text file is under 1 MB in the committed archives."""
MAX_TOTAL_BYTES = 4 * 2**30
MAX_RATIO, RATIO_FLOOR = 100, 64 * 2**20
"""Past ``RATIO_FLOOR`` extracted bytes, at most ``MAX_RATIO`` times the archive's size: xz packs a sweep's run
text 13-17x (docs/frontier_test: 14 MB -> 193 MB), and an archive that unpacks 100x more is no run record."""


class ArchiveError(ValueError):
    """``runs.tar.xz`` cannot be read as a report's runs; the message names the archive and why, in one line."""


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


def _limit(archive: Path) -> int:
    """The most bytes ``archive`` may extract to (module doc)."""
    return min(MAX_TOTAL_BYTES, max(RATIO_FLOOR, MAX_RATIO * archive.stat().st_size))


def _capped(tar: tarfile.TarFile, archive: Path) -> Iterator[tarfile.TarInfo]:
    """The archive's members, one at a time as ``extractall`` takes them, refusing the first past a cap before it is
    written."""
    limit, total = _limit(archive), 0
    for member in tar:
        if member.size > MAX_MEMBER_BYTES:
            raise ArchiveError(f"{archive}: member {member.name!r} holds {member.size:,} bytes, more than the "
                               f"{MAX_MEMBER_BYTES:,} a run's file may (refexp/report/reading/archive.py)")
        total += member.size
        if total > limit:
            raise ArchiveError(f"{archive}: its members hold more than {limit:,} bytes, more than an archive of "
                               f"{archive.stat().st_size:,} bytes of runs may extract to (at most {MAX_RATIO}x its "
                               f"size past {RATIO_FLOOR:,} bytes, {MAX_TOTAL_BYTES:,} in all)")
        yield member


def _extract(archive: Path, into: Path) -> None:
    """``archive`` extracted into ``into`` (the ``data`` filter, the caps); ``ArchiveError`` where it cannot be."""
    expected = "expected the runs.tar.xz `python -m refexp.report.pack_runs` writes"
    try:
        with tarfile.open(archive, "r:xz") as tar:
            tar.extractall(into, members=_capped(tar, archive), filter="data")
    except tarfile.FilterError as e:
        raise ArchiveError(f"{archive}: member {e.tarinfo.name!r} refused ({e}): an archive of runs holds only "
                           f"files and dirs inside it") from e
    except (tarfile.ReadError, tarfile.CompressionError) as e:
        raise ArchiveError(f"{archive}: not a readable xz tar archive ({e}); {expected}") from e
    except (EOFError, lzma.LZMAError, tarfile.TarError) as e:
        raise ArchiveError(f"{archive}: cut short or corrupt ({type(e).__name__}: {e}); {expected}") from e


@contextlib.contextmanager
def runs_source(sweep_dir: Path) -> Iterator[Path]:
    """The dir a report reads its runs from: ``sweep_dir`` itself where it holds run dirs (beside an archive too:
    module doc) or has no archive; else a temporary dir holding its ``runs.tar.xz`` extracted (removed on exit).
    Raises ``ArchiveError`` (a member the ``data`` filter refuses, a cap passed, no xz tar, one cut short) before
    the report reads anything."""
    sweep_dir = Path(sweep_dir)
    archive = sweep_dir / ARCHIVE
    if not archive.is_file() or find_run_dirs(sweep_dir):
        yield sweep_dir
        return
    with tempfile.TemporaryDirectory(prefix="refexp-runs-") as tmp:
        _extract(archive, Path(tmp))
        yield Path(tmp)


@contextlib.contextmanager
def extracted(archive: Path) -> Iterator[Path]:
    """A temporary dir holding ``archive`` (a runs.tar.xz file, whatever its name) extracted as ``runs_source`` does
    (removed on exit): a pilot named by its archive file (``refexp-report --plan ... --pilot runs.tar.xz``)."""
    with tempfile.TemporaryDirectory(prefix="refexp-runs-") as tmp:
        _extract(Path(archive), Path(tmp))
        yield Path(tmp)
