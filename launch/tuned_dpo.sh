#!/usr/bin/env bash
# experiment=tuned_dpo: one sweep per DPO variant over its own grid (4 settings; conf/experiment/tuned_dpo.yaml
# lists them), all into SWEEP_DIR/<variant>/, then one report over the whole dir, whose comparison.select picks
# each variant's setting on validation and compares the chosen ones on test. Extra arguments go to every sweep.
#   launch/tuned_dpo.sh SWEEP_DIR [overrides...]      (REFEXP="python -m refexp" to run from a checkout)
set -euo pipefail
SWEEP=${1:?usage: launch/tuned_dpo.sh SWEEP_DIR [overrides...]}
shift
REFEXP=${REFEXP:-refexp}
grid() {
  local arm=$1
  shift
  $REFEXP -m experiment=tuned_dpo dpo_variant="$arm" "$@" hydra.sweep.dir="$SWEEP/$arm" "${EXTRA[@]}"
}
EXTRA=("$@")
grid fixed algo.beta=0.03,0.1,0.3,1.0
grid periodic_reset algo.beta=0.1,1.0 reference.reset_every=25,100
grid ema algo.beta=0.1,1.0 reference.alpha=0.3,0.6
grid simpo algo.beta=2.5,10 algo.gamma=1.0,4.0
grid orpo algo.lam=0.03,0.1,0.3,1.0
grid rpo algo.beta=0.03,0.1,0.3,1.0
grid nll_only
${REFEXP_REPORT:-refexp-report} "$SWEEP"
