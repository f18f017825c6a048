"""Exploratory: each arm's held-out metric where its runs *pass* a drift mid-run, against the baseline's.

The report's matched contrasts read each arm's curve of *final* points across the frontier key, interpolated between
the two runs around the matched drift; where the baseline's runs around it are far apart (a factor 10 in kl/init in
docs/overoptimization_grpo), that interpolation is a chord across a curve that bends. This script reads the other
points the runs have: every run's own evaluations. Per run that passes ``--at`` (kl/init) between two evaluations,
the metric is interpolated there in log kl/init; per (SFT start, seed) an arm's value is the mean over its runs that
pass it; the printed difference is Student's t over the replicates' differences (no prompt resampling). It is a
different estimand (policies part-way through their run, at whatever β reached the drift), chosen after the data
were seen, so it is exploratory and carries no verdict; an experiment that declares it before its runs
(``comparison.matched.estimand: crossing``) gets it as its primary contrasts, by the same rule
(``refexp/report/statistics/drift_crossing.py``), with the prompts resampled too.

    python scripts/analysis/trajectory_matched.py docs/overoptimization_grpo --at 0.3 --metric eval/gold \
        --baseline fixed
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: refexp without an install

from refexp.record.metric_names import KL_INIT  # noqa: E402
from refexp.report import load_sweep, runs_source  # noqa: E402
from refexp.report.statistics.drift_crossing import crossing_value  # noqa: E402


def crossing(steps_kl: list[tuple[float, float]], at: float):
    """The metric where kl/init first passes ``at`` between two evaluations after step 0, interpolated in log kl/init
    (``steps_kl``: (kl/init, metric) in step order); None when the run never passes it. The rule of the report's
    ``comparison.matched.estimand: crossing`` and of the design step (``drift_crossing.crossing_value``)."""
    return crossing_value(steps_kl, at)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep", type=Path, help="a sweep dir, or a committed report's dir with runs.tar.xz")
    ap.add_argument("--at", type=float, required=True, help="the kl/init to read each run at")
    ap.add_argument("--metric", default="eval/gold")
    ap.add_argument("--baseline", default="fixed")
    ap.add_argument("--arm-key", default="grpo_variant")
    a = ap.parse_args(argv)
    values: dict[str, dict[tuple, list[float]]] = defaultdict(lambda: defaultdict(list))
    with runs_source(a.sweep) as source:
        for run in load_sweep(source):
            if run.problem is not None or run.seed is None:
                continue
            kl, metric = dict(zip(*run.series(KL_INIT))), dict(zip(*run.series(a.metric)))
            points = [(kl[s], metric[s]) for s in sorted(set(kl) & set(metric)) if s > 0]
            got = crossing(points, a.at)
            if got is not None:
                values[run.override(a.arm_key)][(run.sft_start, run.seed)].append(got)
    base = values.get(a.baseline, {})
    for arm in sorted(values):
        if arm == a.baseline:
            continue
        units = sorted(u for u in values[arm] if u in base)
        d = np.array([np.mean(values[arm][u]) - np.mean(base[u]) for u in units])
        row = {"arm": arm, "baseline": a.baseline, "at": a.at, "metric": a.metric, "replicates": len(d),
               "runs": sum(len(values[arm][u]) for u in units), "baseline_runs": sum(len(base[u]) for u in units)}
        if len(d) >= 2:
            half = float(stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d)))
            row |= {"difference": float(d.mean()), "t95": [float(d.mean() - half), float(d.mean() + half)]}
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
