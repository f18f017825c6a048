#!/usr/bin/env bash
# One run over NNODES machines x NPROC processes each (torchrun, c10d rendezvous). Start it on every node
# with the same NNODES, MASTER_ADDR, MASTER_PORT and RDZV_ID; NODE_RANK (0..NNODES-1) is optional
# (the c10d rendezvous numbers the nodes itself; rank 0 then lives on the node that joins first).
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node01 RDZV_ID=grpo-ema-1 NPROC=8 \
#       launch/torchrun_multinode.sh run_dir=/shared/runs/grpo-ema-1 algo=grpo reference=ema
# run_dir= is required and, like REFEXP_CACHE (sft.cache_dir), must be on a filesystem every node sees:
# rank 0 builds the task and the SFT stage into the cache and writes the run dir, the other ranks read them.
# REFEXP_DRY_LAUNCH=1 prints the torchrun command instead of running it.
set -euo pipefail
: "${NNODES:?set NNODES to the number of machines}"
: "${MASTER_ADDR:?set MASTER_ADDR to the host of the rendezvous (the same on every node)}"
: "${RDZV_ID:?set RDZV_ID to an id of this run shared by its nodes (e.g. the SLURM job id)}"
NPROC=${NPROC:-8}
MASTER_PORT=${MASTER_PORT:-29500}
PARALLELISM=${PARALLELISM:-hsdp}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
for name in NNODES NPROC MASTER_PORT ${NODE_RANK:+NODE_RANK}; do
    [[ ${!name} =~ ^[0-9]+$ ]] || { echo "$name=${!name} is invalid: expected a non-negative integer" >&2; exit 2; }
done
if [[ -n ${NODE_RANK:-} ]] && (( NODE_RANK >= NNODES )); then
    echo "NODE_RANK=$NODE_RANK is invalid: expected 0..$((NNODES - 1))" >&2; exit 2
fi
has_run_dir=0
for arg in "$@"; do
    [[ $arg == run_dir=* ]] && has_run_dir=1
    [[ $arg == -m || $arg == --multirun ]] && { echo "-m is not for torchrun: every rank would run the sweep" >&2; exit 2; }
done
(( has_run_dir )) || { echo "pass run_dir=DIR on a filesystem every node sees" >&2; exit 2; }

cmd=(torchrun --nnodes="$NNODES" --nproc_per_node="$NPROC" --rdzv_backend=c10d
     --rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv_id="$RDZV_ID")
[[ -n ${NODE_RANK:-} ]] && cmd+=(--node_rank="$NODE_RANK")
cmd+=(-m refexp parallelism="$PARALLELISM" "$@")
if [[ -n ${REFEXP_DRY_LAUNCH:-} ]]; then
    printf '%q ' "${cmd[@]}"; echo
    exit 0
fi
exec "${cmd[@]}"
