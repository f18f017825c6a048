#!/usr/bin/env bash
# A Hydra multirun on SLURM (hydra-submitit-launcher): one job per sweep point, NPROC tasks (GPUs) per node.
#   PARTITION=gpu NPROC=8 launch/slurm.sh experiment=compare_refs_grpo parallelism=fsdp
# Extra sbatch settings as overrides: hydra.launcher.account=... hydra.launcher.timeout_min=... hydra.launcher.nodes=2
set -euo pipefail
: "${PARTITION:?set PARTITION to the SLURM partition}"
NPROC=${NPROC:-8}
PARALLELISM=${PARALLELISM:-fsdp}
exec refexp -m hydra/launcher=slurm hydra.launcher.partition="$PARTITION" \
    parallelism="$PARALLELISM" parallelism.nproc_per_node="$NPROC" "$@"
