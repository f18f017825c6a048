"""Install, offline, the wheels of bench/gpu_wheels.sh's folder whose distribution this Python lacks, into a
folder for ``PYTHONPATH`` (never into the machine's environment, and never over a distribution it has: a copy
on ``PYTHONPATH`` would shadow the machine's, torch's own requirements included). Writes what it did as JSON.

    python bench/gpu/gpu_install.py WHEELS_DIR TARGET_DIR REPORT.json

``pip install --no-index --no-deps --target`` when this Python has pip, else the wheels are unpacked (a wheel
is a zip of the files to put on ``sys.path``; its ``*.data/purelib`` and ``platlib`` go there too).
"""

from __future__ import annotations

import importlib.metadata as md
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path


def wheel_name_version(path: Path) -> tuple[str, str]:
    name, version = path.name.split("-")[:2]  # {distribution}-{version}(-{build})?-{python}-{abi}-{platform}.whl
    return name, version


def machine_version(name: str):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def unpack(wheel: Path, target: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        z.extractall(target)
    for data in target.glob("*.data"):
        for sub in ("purelib", "platlib"):
            if (data / sub).is_dir():
                shutil.copytree(data / sub, target, dirs_exist_ok=True)
        shutil.rmtree(data)


def main(argv=None) -> dict:
    wheels_dir, target, report = (Path(a) for a in (argv or sys.argv[1:]))
    wheels = sorted(wheels_dir.glob("*.whl"))
    if not wheels:
        raise SystemExit(f"gpu_install: error: no wheels in {wheels_dir} (run bench/gpu_wheels.sh where the package "
                         f"index is reachable, and carry the folder)")
    missing, had = [], {}
    for w in wheels:
        name, version = wheel_name_version(w)
        have = machine_version(name)
        if have is None:
            missing.append(w)
        else:
            had[name] = {"machine": have, "wheel": version}
    target.mkdir(parents=True, exist_ok=True)
    out = {"wheels_dir": str(wheels_dir), "target": str(target), "python": sys.version.split()[0],
           "installed": {wheel_name_version(w)[0]: wheel_name_version(w)[1] for w in missing}, "machine_had": had}
    if missing:
        pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True)
        if pip.returncode == 0:
            p = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                                "--no-build-isolation", "--ignore-requires-python", "--disable-pip-version-check",
                                "--target", str(target), *map(str, missing)], capture_output=True, text=True)
            out["method"] = "pip"
            if p.returncode != 0:
                out["pip_error"] = (p.stderr or p.stdout)[-2000:]
        if pip.returncode != 0 or "pip_error" in out:
            out["method"] = "unzip"
            for w in missing:
                unpack(w, target)
    Path(report).write_text(json.dumps(out, indent=1) + "\n")
    print(f"gpu_install: {len(missing)} of {len(wheels)} wheels installed into {target} ({out.get('method', 'none')}); "
          f"the machine had {', '.join(sorted(had)) or 'none of them'}", file=sys.stderr)
    return out


if __name__ == "__main__":
    main()
