#!/usr/bin/env bash
# The GPU check: install the wheels of bench/gpu_wheels.sh offline into a temporary folder, then run
# gpu_smoke.py and the probes (bench/gpu/gpu_check.py) within the budget. In OUT: deps.json (what the install did;
# not with --toy), gpu_check.json (the figures) and gpu_check.log (every step's output): at most 8 files, what
# the device machine returns. Standard output ends with the table of every figure.
#
#   bash bench/gpu_check.sh OUT [--budget-s N] [--toy] [--wheels DIR] [--deps DIR] [--steps a,b]
#
# --budget-s  wall-clock seconds for all of it, the install included (default 300, at most 360)
# --toy       toy sizes on CPU in this project's own environment (no wheels installed): what the test runs
# --wheels    the wheel folder (default: .gpu_wheels/ at the repo root, where gpu_wheels.sh puts it)
# --deps      install into DIR and keep it (default: a temporary folder, removed at the end), for reruns:
#             PYTHONPATH=$PWD:DIR python bench/gpu/gpu_smoke.py --only FIGURE...
# --steps     only these of gpu_check.py's steps (preflight, train, memory, grpo_step, grpo, decode), comma-separated
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"  # the machine's Python with its torch (PYTHON=... to choose another)
OUT="" BUDGET=300 TOY=0 WHEELS="$REPO/.gpu_wheels" DEPS="" STEPS=""
usage() { echo "usage: bash bench/gpu_check.sh OUT [--budget-s N] [--toy] [--wheels DIR] [--deps DIR] [--steps a,b]" >&2; exit 2; }
while (($#)); do
    case "$1" in
        --budget-s) [ $# -ge 2 ] || usage; BUDGET="$2"; shift 2 ;;
        --budget-s=*) BUDGET="${1#*=}"; shift ;;
        --toy) TOY=1; shift ;;
        --wheels) [ $# -ge 2 ] || usage; WHEELS="$2"; shift 2 ;;
        --deps) [ $# -ge 2 ] || usage; DEPS="$2"; shift 2 ;;
        --steps) [ $# -ge 2 ] || usage; STEPS="$2"; shift 2 ;;
        -h|--help) usage ;;
        -*) echo "gpu_check: error: unknown option $1" >&2; usage ;;
        *) [ -z "$OUT" ] || usage; OUT="$1"; shift ;;
    esac
done
[ -n "$OUT" ] || usage
if ! [[ "$BUDGET" =~ ^[0-9]+([.][0-9]+)?$ ]] || awk -v b="$BUDGET" 'BEGIN {exit !(b <= 0 || b > 360)}'; then
    echo "gpu_check: error: --budget-s must be a number of seconds in (0, 360], got '$BUDGET'" >&2
    exit 2
fi
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
START=$SECONDS
WORK="$(mktemp -d "${TMPDIR:-/tmp}/refexp_gpu_check.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
export REFEXP_CACHE="${REFEXP_CACHE:-$WORK/cache}"
# compile caches pinned outside the temporary folder: a second call on the still-warm machine (bench/gpu_slot.sh's
# step 2) reuses inductor's and triton's compiled kernels instead of compiling the decode steps again
CACHES="${REFEXP_GPU_CACHES:-${TMPDIR:-/tmp}/refexp_gpu_caches}"
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$CACHES/inductor}" TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$CACHES/triton}"
mkdir -p "$TORCHINDUCTOR_CACHE_DIR" "$TRITON_CACHE_DIR"

ARGS=()
[ -z "$STEPS" ] || ARGS+=(--steps "$STEPS")
if [ "$TOY" = 1 ]; then
    export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
    ARGS+=(--toy)
else
    DEPS="${DEPS:-$WORK/deps}"
    "$PY" "$REPO/bench/gpu/gpu_install.py" "$WHEELS" "$DEPS" "$OUT/deps.json"
    DEPS="$(cd "$DEPS" && pwd)"
    # the repo first, then the installed wheels, then the machine's own site-packages
    export PYTHONPATH="$REPO:$DEPS${PYTHONPATH:+:$PYTHONPATH}"
fi
LEFT=$(awk -v b="$BUDGET" -v used=$((SECONDS - START)) 'BEGIN {printf "%.1f", b - used}')
cd "$REPO"
"$PY" bench/gpu/gpu_check.py "$OUT" --budget-s "$LEFT" "${ARGS[@]}"
