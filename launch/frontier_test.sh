#!/usr/bin/env bash
# experiment=frontier_test (conf/experiment/frontier_test.yaml: the design, its size and its comparison block).
# First none over every SFT start and seed (sft.seed the inner loop, so its first jobs train the six starts two at a
# time), then, start by start, one sweep per arm over that arm's beta grid, each into its own fixed dir:
# SWEEP_DIR/none, SWEEP_DIR/start<S>/<arm>. A stopped run of this script holds whole starts of every arm; the same
# command resumes it (each run from its newest checkpoint), skipping a sweep whose runs all completed: such a sweep
# may hold no checkpoint (runs restored from a runs.tar.xz on another machine), and a completed run without one
# would be trained again only to be thrown away (refexp/record/rerun.py). Then one report over the whole dir.
# Extra arguments go to every sweep.
#   launch/frontier_test.sh [SWEEP_DIR] [overrides...]     (REFEXP="python -m refexp" to run from a checkout)
set -euo pipefail
SWEEP=${1:-multirun/frontier_test}
shift || true
REFEXP=${REFEXP:-refexp}
EXTRA=("$@")
STARTS=6 SEEDS=4  # sft.seed 0-5 and training.seed 0-3: the experiment's sweeper params (conf/experiment/frontier_test.yaml)
completed() {  # completed DIR N: each of the sweep's job dirs DIR/0 .. DIR/N-1 holds a completed run
  local i
  for ((i = 0; i < $2; i++)); do
    grep -Eqs '"status": *"completed"' "$1/$i/status.json" || return 1
  done
}
completed "$SWEEP/none" $((STARTS * SEEDS)) ||
  $REFEXP -m experiment=frontier_test grpo_variant=none algo.beta=1.0 hydra.sweep.dir="$SWEEP/none" "${EXTRA[@]}"
grid() {
  local arm=$1 betas=${2#algo.beta=} commas
  commas=${betas//[^,]/}
  completed "$SWEEP/start$START/$arm" $(((${#commas} + 1) * SEEDS)) && return 0
  shift
  $REFEXP -m experiment=frontier_test sft.seed="$START" grpo_variant="$arm" "$@" \
    hydra.sweep.dir="$SWEEP/start$START/$arm" "${EXTRA[@]}"
}
for ((START = 0; START < STARTS; START++)); do
  grid fixed algo.beta=0.2,0.3,0.5,0.7,1.0,2.0,5.0
  grid periodic_reset algo.beta=1.0,2.0,5.0,10.0,25.0
  grid ema algo.beta=1.0,2.0,5.0,10.0,25.0
done
${REFEXP_REPORT:-refexp-report} "$SWEEP"
