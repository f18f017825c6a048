#!/usr/bin/env bash
# A matched design run as its experiment file declares it: the SFT starts and seeds of its sweeper params and each
# arm's beta grid of comparison.matched.grids (the grids its power plan simulated), as per-arm sweeps by
# launch/arm_grids.sh (its order, its dirs, how a rerun resumes, the report at the end). One source for the grids:
# the plan and the runs cannot disagree. Extra arguments go to every sweep.
#   launch/declared_grids.sh EXPERIMENT [SWEEP_DIR] [overrides...]   (default SWEEP_DIR multirun/EXPERIMENT)
set -euo pipefail
EXPERIMENT=$1
SWEEP=${2:-multirun/$EXPERIMENT}
shift $(($# < 2 ? $# : 2))
HERE=$(dirname "$0")
DECLARED=$(python - "$HERE/../conf/experiment/$EXPERIMENT.yaml" <<'PY'
import sys

import yaml

doc = yaml.safe_load(open(sys.argv[1]))
params = doc["hydra"]["sweeper"]["params"]
starts = ",".join(str(int(v)) for v in str(params["sft.seed"]).split(",")) + ","  # a list, even of one start
seeds = len(str(params["training.seed"]).split(","))
grids = (doc["comparison"].get("matched") or {}).get("grids") or {}
arms = [a for a in doc["comparison"]["arms"] if a != "none"]
missing = [a for a in arms if a not in grids]
if missing:
    sys.exit(f"{sys.argv[1]}: comparison.matched.grids declares no grid for {', '.join(missing)}")
print(starts, seeds, " ".join(f"{a}={','.join(repr(float(b)) for b in grids[a])}" for a in arms))
PY
)
read -r STARTS SEEDS GRIDS <<<"$DECLARED"
# shellcheck disable=SC2086  # GRIDS is a list of ARM=B1,B2 words
exec "$HERE/arm_grids.sh" "$EXPERIMENT" "$SWEEP" "$STARTS" "$SEEDS" $GRIDS -- "$@"
