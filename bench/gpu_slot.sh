#!/usr/bin/env bash
# The GPU slot in two device calls on one start-up of the machine (bench/gpu/README.md, "GPU slot"):
#
#   bash bench/gpu_slot.sh 1 OUT   # the check: budget 330 s, killed at 420 s; keeps the installed wheels
#   bash bench/gpu_slot.sh 2 OUT   # within 30 s of step 1's end: what needs step 1's warm compile caches
#
# Step 2 reruns the decode step (its static figures then show compile seconds on warm caches) and, where
# step 1 lost steps (killed, out of time), reruns those; nothing comes after it. The wheels installed by step 1
# and the compile caches (gpu_check.sh pins them) live under KEEP, which survives while the machine is warm.
# GPU_SLOT_ARGS: more options for gpu_check.sh (tests/test_gpu_check.py passes --toy)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KEEP="${REFEXP_GPU_KEEP:-/tmp/refexp_gpu_slot}"
BUDGET_S=330 HARD_S=420
[ $# -eq 2 ] && [[ "$1" =~ ^[12]$ ]] || { echo "usage: bash bench/gpu_slot.sh 1|2 OUT" >&2; exit 2; }
STEP="$1" OUT="$2"
mkdir -p "$KEEP" "$OUT"
export REFEXP_GPU_CACHES="$KEEP/caches"
if [ "$STEP" = 1 ]; then
    date -u +%s > "$KEEP/step1_start"
    timeout -k 10 "$HARD_S" bash "$REPO/bench/gpu_check.sh" "$OUT" --budget-s "$BUDGET_S" --deps "$KEEP/deps" \
        ${GPU_SLOT_ARGS:-} || echo "gpu_slot: step 1 ended with status $? (124: killed at ${HARD_S} s)" >&2
    cp "$OUT/gpu_check.json" "$KEEP/step1.json" 2>/dev/null || true
    date -u +%s > "$KEEP/step1_end"
    exit 0
fi
# step 2: the decode step again on warm caches, plus any step step 1 did not finish
if [ -f "$KEEP/step1_end" ]; then
    echo "gpu_slot: step 2 starts $(( $(date -u +%s) - $(cat "$KEEP/step1_end") )) s after step 1's end" >&2
else
    echo "gpu_slot: no step 1 on this machine (a fresh start: caches and wheels are cold)" >&2
fi
STEPS="$(python3 - "$KEEP/step1.json" <<'PY'
import json, sys
steps = ["decode"]
try:
    done = json.load(open(sys.argv[1]))["steps"]
except (OSError, ValueError, KeyError):
    done = {}
for name in ("preflight", "train", "memory", "grpo_step", "grpo"):
    rec = done.get(name)
    if rec is not None and (rec.get("skipped") or rec.get("timed_out") or rec.get("rc")):
        steps.append(name)
print(",".join(steps))
PY
)"
echo "gpu_slot: step 2 runs --steps $STEPS" >&2
timeout -k 10 "$HARD_S" bash "$REPO/bench/gpu_check.sh" "$OUT" --budget-s "$BUDGET_S" --deps "$KEEP/deps" \
    --steps "$STEPS" ${GPU_SLOT_ARGS:-}
