"""Carry the frontier_test sweep to the next sitting: pack its completed sweeps and the SFT starts the rest needs.

Run after the sweep is stopped (at a sweep boundary), from main's venv:

    python docs/frontier_test/in_progress/carry.py SWEEP CACHE
    python docs/frontier_test/in_progress/carry.py --check   # extract both archives and verify them

SWEEP is the sweep dir (`.../multirun/frontier_test`), CACHE the `REFEXP_CACHE` whose `sft/<key>/` entries the runs
used. A sweep (`none`, or one `start<i>/<arm>`) is carried only when all its runs completed; the job dirs of any
other sweep are moved to `SWEEP/../aside/` first, so `pack_runs` reads completed sweeps only (the launch script
reruns a sweep that is not whole). `runs.tar.xz` is rewritten with every completed run so far; `sft_starts.tar.xz`
with the cache entries of the starts not yet done (mtime 0, so the archive depends on the files only), unless the
committed one already holds them all. `--check` extracts both into a temporary dir, verifies every SFT entry against
its manifest, counts the completed runs per sweep and prints which sweep the launch script would run next
(`REFEXP=echo`).
"""

import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

# Jobs per sweep: the arm's β values × 4 seeds (conf/experiment/frontier_test.yaml); `none` is 6 starts × 4 seeds.
JOBS = {"none": 24, "fixed": 28, "periodic_reset": 20, "ema": 20}
STARTS = 6
ARMS = ("fixed", "periodic_reset", "ema")
HERE = Path(__file__).resolve().parent
MAIN = HERE.parents[2]


def arm_sweeps(sweep: Path) -> list[Path]:
    """The sweep's own sweeps: `none`, then each `start<i>/<arm>`."""
    return [d for d in [sweep / "none", *sorted(sweep.glob("start*/*"))] if d.is_dir()]


def completed(sweep: Path) -> int:
    n = 0
    for status in sweep.glob("*/status.json"):
        try:
            n += json.loads(status.read_text()).get("status") == "completed"
        except ValueError:  # a status being written when the sweep was stopped
            pass
    return n


def start_keys(none_sweep: Path) -> dict[int, str]:
    """sft.seed → the SFT cache key its runs recorded (each `none` run names its start's seed in its overrides)."""
    keys = {}
    for status in none_sweep.glob("*/status.json"):
        record = json.loads(status.read_text())
        overrides = (status.parent / ".hydra" / "overrides.yaml").read_text()
        seed = int(overrides.split("sft.seed=")[1].split()[0])
        if record.get("sft_start"):
            keys[seed] = record["sft_start"]["key"]
    return keys


def add_entry(tar: tarfile.TarFile, cache_sft: Path, key: str) -> None:
    for path in sorted((cache_sft / key).rglob("*")):
        info = tar.gettarinfo(str(path), arcname=str(path.relative_to(cache_sft)))
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        if path.is_file():
            with open(path, "rb") as fh:
                tar.addfile(info, fh)
        else:
            tar.addfile(info)


def main(sweep: Path, cache: Path) -> None:
    whole = {}
    for arm_sweep in arm_sweeps(sweep):
        name = str(arm_sweep.relative_to(sweep))
        done = completed(arm_sweep)
        whole[name] = done == JOBS[arm_sweep.name]
        if not whole[name]:
            aside = sweep.parent / "aside" / name
            aside.parent.mkdir(parents=True, exist_ok=True)
            print(f"not whole: {name} ({done} of {JOBS[arm_sweep.name]} completed), moved to {aside}")
            shutil.move(str(arm_sweep), str(aside))
    if not whole.get("none"):
        sys.exit("the none sweep is not whole: the start keys are read from it")
    keys = start_keys(sweep / "none")
    todo = [s for s in range(STARTS) if not all(whole.get(f"start{s}/{arm}") for arm in ARMS)]
    print("whole sweeps:", sorted(k for k, v in whole.items() if v))
    print("starts not done:", {s: keys[s] for s in todo})
    subprocess.run([sys.executable, "-m", "refexp.report.pack_runs", str(sweep), str(HERE)], check=True)
    archive = HERE / "sft_starts.tar.xz"
    if archive.is_file() and {keys[s] for s in todo} <= carried_keys(archive):
        # A superset resumes the same: keeping the committed archive adds no second copy of its weights to git.
        print(f"{archive.name} already holds every start not done: kept")
        return
    partial = HERE / "sft_starts.tar.xz.partial"
    with tarfile.open(partial, "w:xz", preset=9) as tar:
        for s in todo:
            add_entry(tar, cache / "sft", keys[s])
    partial.replace(archive)
    print(f"{archive.name}: {len(todo)} starts, {archive.stat().st_size / 1e6:.1f} MB")


def carried_keys(archive: Path) -> set[str]:
    with tarfile.open(archive) as tar:
        return {name.split("/")[0] for name in tar.getnames()}


def check() -> None:
    from refexp.record.cache_dirs import verified_entry

    with tempfile.TemporaryDirectory() as tmp:
        sweep, cache_sft = Path(tmp) / "multirun" / "frontier_test", Path(tmp) / "cache" / "sft"
        sweep.mkdir(parents=True)
        cache_sft.mkdir(parents=True)
        with tarfile.open(HERE / "runs.tar.xz") as tar:
            tar.extractall(sweep, filter="data")
        with tarfile.open(HERE / "sft_starts.tar.xz") as tar:
            tar.extractall(cache_sft, filter="data")
        for entry in sorted(cache_sft.iterdir()):
            print(f"sft/{entry.name}: manifest ok, digest {verified_entry(entry, 'SFT model')[:12]}")
        total = 0
        for arm_sweep in arm_sweeps(sweep):
            done = completed(arm_sweep)
            total += done
            print(f"{arm_sweep.relative_to(sweep)}: {done} of {JOBS[arm_sweep.name]} completed")
        print(f"{total} completed runs carried")
        launched = subprocess.run(
            ["bash", str(MAIN / "launch" / "frontier_test.sh"), str(sweep)], capture_output=True, text=True,
            check=True, env={"PATH": "/usr/bin:/bin", "REFEXP": "echo", "REFEXP_REPORT": "true"}).stdout
        print("the launch script would run next:", launched.splitlines()[:1])


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        check()
    else:
        main(Path(sys.argv[1]), Path(sys.argv[2]))
