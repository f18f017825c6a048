#!/usr/bin/env bash
# experiment=overoptimization_grpo (conf/experiment/overoptimization_grpo.yaml: the design, its size and its
# comparison block). One sweep per arm over that arm's beta grid (Hydra's grid sweeper has no per-arm grid), each
# into its own fixed dir SWEEP_DIR/<arm>, the seeds the inner loop; none first, whose first job trains the SFT start
# and the proxy once (cached) before the others start. The same command resumes a stopped run of it (each run from
# its newest checkpoint, a completed one measures nothing). Then one report over the whole dir. Extra arguments go
# to every sweep.
#   launch/overoptimization_grpo.sh [SWEEP_DIR] [overrides...]     (REFEXP="python -m refexp" to run from a checkout)
set -euo pipefail
SWEEP=${1:-multirun/overoptimization_grpo}
shift || true
REFEXP=${REFEXP:-refexp}
EXTRA=("$@")
grid() {
  local arm=$1
  shift
  $REFEXP -m experiment=overoptimization_grpo grpo_variant="$arm" "$@" hydra.sweep.dir="$SWEEP/$arm" "${EXTRA[@]}"
}
grid none algo.beta=1.0
grid fixed algo.beta=0.05,0.1,0.2,0.5
grid periodic_reset algo.beta=0.2,0.5,1.0,2.0
grid ema algo.beta=0.2,0.5,1.0,2.0
${REFEXP_REPORT:-refexp-report} "$SWEEP"
