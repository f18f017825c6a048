#!/usr/bin/env bash
# Download, on a machine that reaches the package index, the wheels the GPU machine lacks (bench/gpu/gpu_wheels.txt)
# for Python 3.12 on manylinux x86-64, into an ignored folder, and check that they fit the 64 MiB that may
# travel with the working tree. bench/gpu_check.sh installs them there, offline.
#
#   bash bench/gpu_wheels.sh [DIR]      # DIR defaults to .gpu_wheels/ at the repo root (git-ignored)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LIST="$REPO/bench/gpu/gpu_wheels.txt"
DEST="${1:-$REPO/.gpu_wheels}"
LIMIT_BYTES=$((64 * 1024 * 1024))
PY="${PYTHON:-python3}"  # the interpreter whose pip downloads (PYTHON=... to choose another)

# "name==version" per line; '#' starts a comment. Lines whose comment says "sdist" have no wheel on the index.
mapfile -t WHEELS < <(grep -v '^\s*#' "$LIST" | grep -v 'sdist' | sed 's/#.*//' | awk 'NF {print $1}')
mapfile -t SDISTS < <(grep -v '^\s*#' "$LIST" | grep 'sdist' | sed 's/#.*//' | awk 'NF {print $1}')

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --dest "$TMP" "${WHEELS[@]}"
if ((${#SDISTS[@]})); then  # pure-Python source archives: a py3-none-any wheel built here installs anywhere
    "$PY" -m pip wheel --quiet --no-deps --wheel-dir "$TMP" "${SDISTS[@]}"
fi

expected=$((${#WHEELS[@]} + ${#SDISTS[@]}))
got=$(find "$TMP" -maxdepth 1 -name '*.whl' | wc -l)
if [ "$got" -ne "$expected" ]; then
    echo "gpu_wheels: error: $got wheels for $expected lines of $LIST" >&2
    exit 1
fi
total=$(find "$TMP" -maxdepth 1 -name '*.whl' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
if [ "$total" -gt "$LIMIT_BYTES" ]; then
    echo "gpu_wheels: error: $((total / 1024 / 1024)) MiB of wheels, over the 64 MiB that may travel" >&2
    exit 1
fi
rm -rf "$DEST" && mkdir -p "$DEST" && mv "$TMP"/*.whl "$DEST"/
ls -l "$DEST" | awk 'NR > 1 {printf "%10d  %s\n", $5, $9}'
awk -v t="$total" -v n="$got" 'BEGIN {printf "gpu_wheels: %d wheels, %.2f MiB in all, in '"$DEST"'\n", n, t / 1048576}'
