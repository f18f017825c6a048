#!/usr/bin/env bash
# One experiment run as per-arm beta grids (Hydra's grid sweeper has no per-arm grid), each sweep into its own fixed
# dir under SWEEP_DIR: first none over every SFT start and seed (sft.seed the inner loop, so its first jobs train the
# starts two at a time), then, start by start, one sweep per arm over that arm's grid: SWEEP_DIR/none,
# SWEEP_DIR/start<S>/<arm>. A stopped run holds whole starts of every arm; the same command resumes it (each run from
# its newest checkpoint), skipping a sweep whose runs all completed: such a sweep may hold no checkpoint (runs
# restored from a runs.tar.xz on another machine), and a completed run without one would be trained again only to be
# thrown away (refexp/record/rerun.py). Then one report over the whole dir.
#   launch/arm_grids.sh EXPERIMENT SWEEP_DIR STARTS SEEDS ARM=B1,B2,... [ARM=...] [-- overrides...]
# STARTS: the experiment's sweeper param sft.seed, as a count N (sft.seed 0..N-1) or as its values with commas
# (6,7,8: starts no earlier sweep trained); SEEDS: the count of its training.seed values.
# REFEXP="python -m refexp" runs from a checkout; REFEXP_REPORT=true skips the report.
set -euo pipefail
EXPERIMENT=$1 SWEEP=$2 STARTS=$3 SEEDS=$4
shift 4
REFEXP=${REFEXP:-refexp}
GRIDS=()
while (($#)) && [[ $1 != -- ]]; do GRIDS+=("$1"); shift; done
(($#)) && shift
EXTRA=("$@")
completed() {  # completed DIR N: each of the sweep's job dirs DIR/0 .. DIR/N-1 holds a completed run
  local i
  for ((i = 0; i < $2; i++)); do
    grep -Eqs '"status": *"completed"' "$1/$i/status.json" || return 1
  done
}
if [[ $STARTS == *,* ]]; then IFS=, read -ra START_IDS <<<"$STARTS"; else START_IDS=($(seq 0 $((STARTS - 1)))); fi
completed "$SWEEP/none" $((${#START_IDS[@]} * SEEDS)) ||
  $REFEXP -m experiment="$EXPERIMENT" grpo_variant=none algo.beta=1.0 hydra.sweep.dir="$SWEEP/none" "${EXTRA[@]}"
grid() {  # grid ARM=B1,B2,...: one sweep of START over the arm's grid, unless all its runs completed
  local arm=${1%%=*} betas=${1#*=} commas
  commas=${betas//[^,]/}
  completed "$SWEEP/start$START/$arm" $(((${#commas} + 1) * SEEDS)) && return 0
  $REFEXP -m experiment="$EXPERIMENT" sft.seed="$START" grpo_variant="$arm" algo.beta="$betas" \
    hydra.sweep.dir="$SWEEP/start$START/$arm" "${EXTRA[@]}"
}
for START in "${START_IDS[@]}"; do
  for g in "${GRIDS[@]}"; do grid "$g"; done
done
${REFEXP_REPORT:-refexp-report} "$SWEEP"
