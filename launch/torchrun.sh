#!/usr/bin/env bash
# One run on NPROC processes of this machine (torchrun). PARALLELISM: fsdp | tp | hsdp | fsdp_tp.
#   NPROC=2 PARALLELISM=fsdp launch/torchrun.sh algo=grpo reference=ema
set -euo pipefail
NPROC=${NPROC:-2}
PARALLELISM=${PARALLELISM:-fsdp}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec torchrun --standalone --nproc_per_node="$NPROC" -m refexp parallelism="$PARALLELISM" "$@"
