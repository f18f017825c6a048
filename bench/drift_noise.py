"""How noisy each run's drift measurement is: the relative standard error of its final ``kl/init`` (the sampled
tokens' k3) and ``kl/init_exact`` (each position's KL over the whole vocabulary, docs/algorithms.md) over its kl
prompts, and how often one prompt carries more than a fifth of the total.

A run's drift is the mean of its prompts' linearised contributions (``eval_outcomes.jsonl``,
refexp/components/evaluation.py ``kl_influence``), so its standard error is their sample std over sqrt(n) (what a
bootstrap over prompts gives, to first order). Each table row is one metric over the runs that logged it at their last
evaluation; the last row pairs the two estimators run by run (the exact one's error over the k3 one's).

    python bench/drift_noise.py SWEEP_DIR   # a sweep dir, or a committed report's dir with its runs.tar.xz
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from refexp.record.metric_names import KL_INIT, KL_INIT_EXACT, KL_INIT_EXACT_RETAIN, KL_INIT_RETAIN  # noqa: E402
from refexp.record.outcomes import read_outcomes  # noqa: E402
from refexp.report.reading.archive import runs_source  # noqa: E402
from refexp.report.reading.load import find_run_dirs  # noqa: E402

METRICS = (KL_INIT, KL_INIT_EXACT, KL_INIT_RETAIN, KL_INIT_EXACT_RETAIN)
DOMINANT = 0.2
"""A prompt whose contribution is more than this share of the run's total dominates its drift."""


def final_contributions(run_dir: Path) -> dict[str, np.ndarray]:
    """metric -> the per-prompt contributions of the run's last evaluation that logged it."""
    out: dict[str, np.ndarray] = {}
    for _, o in read_outcomes(run_dir):  # in the order written: a later evaluation replaces an earlier one
        if o.metric in METRICS:
            out[o.metric] = np.asarray(o.scores, dtype=float)
    return out


def relative_se(scores: np.ndarray) -> float:
    """The standard error of the mean of ``scores`` over its mean (nan where the mean is not > 0)."""
    mean = scores.mean()
    return float(scores.std(ddof=1) / math.sqrt(len(scores)) / mean) if len(scores) > 1 and mean > 0 else math.nan


def top_share(scores: np.ndarray) -> float:
    """The largest prompt's share of the run's total."""
    total = scores.sum()
    return float(scores.max() / total) if total > 0 else math.nan


def table(runs: list[dict[str, np.ndarray]]) -> list[str]:
    """The markdown rows: per metric the runs, the median (quartiles) and largest relative standard error and the runs
    with a dominant prompt; then the exact-over-k3 ratio of the paired runs."""
    lines = ["| metric | runs | relative standard error, median (quartiles) | largest | runs with one prompt > 20% |",
             "|---|---|---|---|---|"]
    for metric in METRICS:
        got = [r[metric] for r in runs if metric in r]
        rse = np.array([relative_se(s) for s in got])
        rse = rse[np.isfinite(rse)]
        if not len(rse):
            continue
        q1, med, q3 = np.percentile(rse, [25, 50, 75])
        dominant = sum(top_share(s) > DOMINANT for s in got)
        lines.append(f"| `{metric}` | {len(rse)} | {med:.1%} ({q1:.1%}-{q3:.1%}) | {rse.max():.1%} | "
                     f"{dominant} of {len(got)} |")
    for exact, k3 in ((KL_INIT_EXACT, KL_INIT), (KL_INIT_EXACT_RETAIN, KL_INIT_RETAIN)):
        ratio = np.array([relative_se(r[exact]) / relative_se(r[k3]) for r in runs if exact in r and k3 in r])
        ratio = ratio[np.isfinite(ratio)]
        if len(ratio):
            q1, med, q3 = np.percentile(ratio, [25, 50, 75])
            lines.append(f"| `{exact}` / `{k3}`, run by run | {len(ratio)} | {med:.2f} ({q1:.2f}-{q3:.2f}) | "
                         f"{ratio.max():.2f} | |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sweep_dir", type=Path)
    args = p.parse_args(argv)
    with runs_source(args.sweep_dir) as src:
        runs = [c for c in (final_contributions(d) for d in find_run_dirs(src)) if c]
    if not runs:
        print(f"drift_noise: no run below {args.sweep_dir} logged per-prompt drift (eval_outcomes.jsonl)",
              file=sys.stderr)
        return 2
    print("\n".join(table(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
