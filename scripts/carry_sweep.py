"""Carry an unfinished sweep to the next sitting: its completed runs and the SFT starts they were trained from.

A sweep that takes longer than one sitting (docs/runs.md, "A sweep over several sittings") is stopped, and a
sitting's machine may not be the next one's, so what it has done is packed into OUT, a dir outside the checkout
that goes with the sweep to the next machine (never into git: an unfinished sweep and its SFT starts are data every
clone would pay for):

    python scripts/carry_sweep.py SWEEP CACHE OUT          # OUT/runs.tar.xz and OUT/sft_starts.tar.xz
    python scripts/carry_sweep.py --check OUT              # extract both, verify, count the runs per sweep

SWEEP is the sweep dir (each of its sweeps a dir with Hydra's ``multirun.yaml``: ``none``, ``start<S>/<arm>`` for
``launch/arm_grids.sh``), CACHE the ``REFEXP_CACHE`` whose ``sft/<key>/`` entries the runs recorded
(``status.json``'s ``sft_start.key``). Only completed runs are carried (``refexp.report.pack_runs``'s files: no
checkpoints): a relaunch of the same command skips a sweep whose runs all completed and reruns the others, where
a restored completed run measures nothing (refexp/record/rerun.py). ``sft_starts.tar.xz`` holds every start the runs
recorded, each entry with its manifest of sha256s, which ``--check`` verifies as a run would
(``refexp.record.cache_dirs.verified_entry``); its members have mtime 0 and no owner, so it depends on the files only,
and an archive already holding every start the runs recorded is kept as it is (the weights are the bulk: a later
carry rewrites only the runs).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: refexp without an install

from refexp.record.cache_dirs import verified_entry  # noqa: E402
from refexp.report.reading.archive import ARCHIVE, extracted, pack  # noqa: E402

STARTS = "sft_starts.tar.xz"


def _status(run: Path) -> dict:
    try:
        return json.loads((run / "status.json").read_text())
    except (OSError, ValueError):  # a status being written when the sweep was stopped
        return {}


def completed_runs(sweep: Path) -> list[Path]:
    """The run dirs under ``sweep`` whose status.json says completed, in path order."""
    return [p.parent for p in sorted(sweep.rglob("status.json")) if _status(p.parent).get("status") == "completed"]


def start_keys(runs: list[Path]) -> list[str]:
    """The SFT cache keys the runs recorded, each once, in the order first seen."""
    return list(dict.fromkeys(key for r in runs if (key := (_status(r).get("sft_start") or {}).get("key"))))


def _reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    return info


def _held(starts: Path) -> set[str]:
    """The SFT cache keys an existing starts archive holds (none where there is no archive)."""
    if not starts.is_file():
        return set()
    with tarfile.open(starts, "r:xz") as tar:
        return {m.name.split("/")[0] for m in tar.getmembers()}


def carry(sweep: Path, cache: Path, out: Path) -> tuple[int, list[str]]:
    """Write ``out/runs.tar.xz`` (the completed runs, at their paths under ``sweep``, with each sweep's
    multirun.yaml) and ``out/sft_starts.tar.xz`` (their SFT cache entries); (runs carried, start keys)."""
    runs = completed_runs(sweep)
    if not runs:
        raise SystemExit(f"carry_sweep: {sweep} holds no completed run: nothing to carry")
    keys = start_keys(runs)
    missing = [k for k in keys if not (cache / "sft" / k).is_dir()]
    if missing:
        raise SystemExit(f"carry_sweep: {cache}/sft has no entry {', '.join(missing)}: CACHE must be the "
                         f"REFEXP_CACHE the runs were trained with")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "sweep"
        for run in runs:
            shutil.copytree(run, copy / run.relative_to(sweep), ignore=shutil.ignore_patterns("checkpoint", "wandb"))
        for marker in sweep.rglob("multirun.yaml"):
            (copy / marker.relative_to(sweep)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(marker, copy / marker.relative_to(sweep))
        pack(copy, out)
    if _held(out / STARTS) >= set(keys):  # the starts are the bulk and do not change: pack them once
        return len(runs), keys
    with tarfile.open(out / STARTS, "w:xz") as tar:
        for key in keys:
            for path in sorted((cache / "sft" / key).rglob("*")):
                tar.add(path, arcname=str(path.relative_to(cache / "sft")), recursive=False, filter=_reset)
    return len(runs), keys


def check(out: Path) -> str:
    """Both archives extracted and verified: each SFT entry against its manifest, the runs counted per sweep."""
    lines = []
    with extracted(out / ARCHIVE) as runs_dir:
        per_sweep = Counter(str(r.relative_to(runs_dir).parent) for r in completed_runs(runs_dir))
        keys = start_keys(completed_runs(runs_dir))
        lines += [f"{n} completed runs in {sweep}" for sweep, n in sorted(per_sweep.items())]
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(out / STARTS, "r:xz") as tar:
        tar.extractall(tmp, filter="data")
        for key in keys:
            verified_entry(Path(tmp) / key, f"the carried SFT start {key}")
            lines.append(f"SFT start {key}: every file matches its manifest")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", type=Path, metavar="OUT", help="extract OUT's two archives and verify them")
    ap.add_argument("paths", nargs="*", type=Path, metavar="SWEEP CACHE OUT")
    a = ap.parse_args(argv)
    if a.check:
        print(check(a.check))
        return 0
    if len(a.paths) != 3:
        ap.error("expected SWEEP CACHE OUT (or --check OUT)")
    n, keys = carry(*a.paths)
    print(f"{a.paths[2]}: {n} completed runs, {len(keys)} SFT start(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
