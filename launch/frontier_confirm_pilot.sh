#!/usr/bin/env bash
# experiment=frontier_confirm_pilot (conf/experiment/frontier_confirm_pilot.yaml: why these grids), as per-arm beta
# grids by launch/arm_grids.sh (its order of sweeps, and how a rerun resumes). Extra arguments go to every sweep.
#   launch/frontier_confirm_pilot.sh [SWEEP_DIR] [overrides...]   (REFEXP="python -m refexp" to run from a checkout)
set -euo pipefail
SWEEP=${1:-multirun/frontier_confirm_pilot}
shift || true
# sft.seed 0-1 and training.seed 0-1: the experiment's sweeper params
exec "$(dirname "$0")/arm_grids.sh" frontier_confirm_pilot "$SWEEP" 2 2 \
  fixed=0.3,0.5,1.0,2.0,5.0 ema=3.0,5.0,10.0,20.0,40.0 periodic_reset=5.0,10.0,25.0,50.0,100.0 -- "$@"
