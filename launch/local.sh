#!/usr/bin/env bash
# One process: refexp with the given Hydra overrides (CPU or one GPU).
#   launch/local.sh algo=grpo reference=ema training.steps=50
set -euo pipefail
exec refexp "$@"
