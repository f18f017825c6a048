#!/usr/bin/env bash
# experiment=frontier_test (conf/experiment/frontier_test.yaml: the design, its size and its comparison block), as
# per-arm beta grids by launch/arm_grids.sh (its order of sweeps, and how a rerun resumes). Extra arguments go to
# every sweep.
#   launch/frontier_test.sh [SWEEP_DIR] [overrides...]     (REFEXP="python -m refexp" to run from a checkout)
set -euo pipefail
SWEEP=${1:-multirun/frontier_test}
shift || true
# sft.seed 0-5 and training.seed 0-3: the experiment's sweeper params
exec "$(dirname "$0")/arm_grids.sh" frontier_test "$SWEEP" 6 4 \
  fixed=0.2,0.3,0.5,0.7,1.0,2.0,5.0 periodic_reset=1.0,2.0,5.0,10.0,25.0 ema=1.0,2.0,5.0,10.0,25.0 -- "$@"
