#!/usr/bin/env bash
# A local Hydra multirun whose jobs each start NPROC worker processes (jobs run one after another).
#   NPROC=2 launch/sweep.sh algo=grpo reference=fixed,periodic_reset,ema,kl_triggered,none
set -euo pipefail
NPROC=${NPROC:-2}
PARALLELISM=${PARALLELISM:-fsdp}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec refexp -m parallelism="$PARALLELISM" parallelism.nproc_per_node="$NPROC" "$@"
