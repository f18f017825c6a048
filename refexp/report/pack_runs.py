"""Pack a sweep's runs into ``OUT_DIR/runs.tar.xz`` beside its committed report (``reading/archive.py``):

    python -m refexp.report.pack_runs SWEEP_DIR OUT_DIR
    refexp-report OUT_DIR   # the report, rendered from the archive
"""

from __future__ import annotations

import sys
from pathlib import Path

from refexp.report.reading.archive import pack


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m refexp.report.pack_runs SWEEP_DIR OUT_DIR", file=sys.stderr)
        return 2
    try:
        path = pack(Path(argv[0]), Path(argv[1]))
    except ValueError as e:
        print(f"pack_runs: {e}", file=sys.stderr)
        return 2
    print(f"{path}: {path.stat().st_size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
