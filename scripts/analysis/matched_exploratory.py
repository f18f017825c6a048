"""Exploratory: where each arm's runs ended on the matched axis, and the declared matched contrasts read again at
values, or over replicates, chosen after the data were seen.

A report tests ``comparison.primary`` at ``comparison.matched.at``, declared before the runs
(``refexp/report/statistics/declared_matched.py``). Where a primary contrast made no claim because some replicate's
runs never reached the declared value, this script says how many replicates (SFT start, seed) each arm's runs
bracket it in (``--reach``), and reads the same machinery at other values (``--at``) or over the replicates where
every compared arm reaches it (``--reached-only``, a subset chosen by an outcome). Either is decided after seeing the
data, so what it prints is exploratory: the verdict words are the machinery's, not claims.

``--beta-path X`` reads each replicate's curve another way: the report sorts an arm's runs by their final drift and
interpolates between the two nearest X (``comparison.matched.along: axis``, the default), so where drift is not
monotone in the frontier key (kl/init stops growing once a policy answers every prompt the same way) the two can be
β 2 and β 10, past the declared gap rule. Here the runs are walked along the key instead (what a block declaring
``along: key`` reads, ``frontier_key.key_crossing``); a replicate whose path never crosses X is counted and left
out. The difference arm − baseline per replicate is averaged over each SFT start's
seeds, and the interval is Student's t over the starts (no prompt resampling).

    python scripts/analysis/matched_exploratory.py docs/frontier_test --reach 0.05 0.065 0.08 0.1
    python scripts/analysis/matched_exploratory.py docs/frontier_test --at 0.1
    python scripts/analysis/matched_exploratory.py docs/frontier_test --at 0.065 --reached-only
    python scripts/analysis/matched_exploratory.py docs/frontier_test --beta-path 0.065
    python scripts/analysis/matched_exploratory.py docs/frontier_test --at 0.065 --along key  # the report's bootstrap
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: refexp without an install

from refexp.report import DRIFT_AXIS, curves, declared_matched, key_crossing, last, load_sweep, make_plan, runs_source  # noqa: E402


def ranges(runs, plan, axis: str) -> dict[str, dict[tuple, tuple[float, float]]]:
    """arm -> (SFT start, seed) -> (lowest, highest) final ``axis`` over the arm's completed runs there."""
    out: dict[str, dict[tuple, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        value = last(r, axis)
        if r.problem is None and plan.counts(r) and value is not None:
            out[plan.arm(r)][(r.sft_start, r.seed)].append(value)
    return {arm: {rep: (min(v), max(v)) for rep, v in reps.items()} for arm, reps in out.items()}


def reach_table(spans, values: list[float]) -> str:
    """How many replicates each arm's runs bracket each value in, and the replicates' lowest final values."""
    lines = ["| arm | replicates | " + " | ".join(f"bracket {x:g}" for x in values) + " | lowest final, per replicate "
             "(median, max) |", "|---|---:|" + "---:|" * len(values) + "---|"]
    for arm, reps in sorted(spans.items()):
        lows = sorted(lo for lo, _ in reps.values())
        counts = [sum(lo <= x <= hi for lo, hi in reps.values()) for x in values]
        lines.append(f"| {arm} | {len(reps)} | " + " | ".join(str(c) for c in counts)
                     + f" | {lows[len(lows) // 2]:.3g}, {lows[-1]:.3g} |")
    return "\n".join(lines)


def path_crossing(points, x: float):
    """The metric where the runs, walked along the frontier key, cross ``x`` (``key_crossing``'s two neighbours,
    interpolated in log x); None where they never do."""
    pair = key_crossing(points, x)
    if pair is None:
        return None
    a, b = pair
    f = 0.0 if b.x == a.x else math.log(x / a.x) / math.log(b.x / a.x)
    return a.y + f * (b.y - a.y)


def beta_path(runs, plan, x: float) -> str:
    """Each primary arm against the baseline where their paths across the frontier key cross ``x``."""
    cs = curves(runs, plan, DRIFT_AXIS, plan.metric)
    by_arm = {}
    for label, by_seed in cs.items():
        by_arm.setdefault(plan.arm(next(iter(by_seed.values()))[0].run), by_seed)
    base = by_arm.get(plan.baseline, {})
    lines = []
    for arm in plan.primary:
        mine = by_arm.get(arm, {})
        reps = sorted(set(mine) & set(base))
        diffs, missed = defaultdict(list), []
        for rep in reps:
            a, b = path_crossing(mine[rep], x), path_crossing(base[rep], x)
            if a is None or b is None:
                missed.append(rep)
            else:
                diffs[rep[0]].append(a - b)
        per_start = np.array([np.mean(d) for d in diffs.values()])
        head = (f"{arm} − {plan.baseline} at {DRIFT_AXIS.key} {x:g} along β: {len(reps) - len(missed)} of "
                f"{len(reps)} replicates cross it")
        if len(per_start) < 2:
            lines.append(head + "; fewer than 2 SFT starts left: no interval")
            continue
        half = stats.t.ppf(0.975, len(per_start) - 1) * per_start.std(ddof=1) / math.sqrt(len(per_start))
        lines.append(f"{head}; {per_start.mean():+.3f} [{per_start.mean() - half:+.3f}, {per_start.mean() + half:+.3f}]"
                     f" (95% Student t over {len(per_start)} SFT starts)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep", type=Path, help="a sweep dir or a report dir holding runs.tar.xz")
    ap.add_argument("--reach", type=float, nargs="+", help="print how many replicates each arm brackets these in")
    ap.add_argument("--at", type=float, nargs="+", help="read the primary contrasts at these values instead")
    ap.add_argument("--beta-path", type=float, nargs="+", help="read each curve along the frontier key at these")
    ap.add_argument("--along", choices=("axis", "key"), help="with --at: read the curves as comparison.matched.along "
                    "says (default: as the sweep declared)")
    ap.add_argument("--reached-only", action="store_true",
                    help="with --at: only the replicates where the baseline and every primary arm bracket each value")
    args = ap.parse_args(argv)
    with runs_source(args.sweep) as d:
        runs = load_sweep(d)
        plan = make_plan(runs)
        if not plan.declared or not plan.matched_at[1]:
            print(f"{args.sweep}: no declared comparison.matched", file=sys.stderr)
            return 2
        axis, declared = plan.matched_at
        spans = ranges(runs, plan, axis)
        if args.reach:
            print(f"Exploratory. Final {axis} per replicate (SFT start, seed), declared matched value(s): "
                  f"{', '.join(f'{x:g}' for x in declared)}\n")
            print(reach_table(spans, args.reach))
        for x in args.at or ():
            keep = None
            if args.reached_only:
                arms = [plan.baseline, *plan.primary]
                keep = {rep for rep in spans.get(plan.baseline, {})
                        if all(rep in spans.get(a, {}) and spans[a][rep][0] <= x <= spans[a][rep][1] for a in arms)}
            chosen = [r for r in runs if keep is None or (r.sft_start, r.seed) in keep or plan.arm(r) not in
                      (plan.baseline, *plan.primary)]
            block = {**plan.block, "matched": {"axis": axis, "at": [x], "along": args.along or plan.matched_along}}
            matched = declared_matched(chosen, dataclasses.replace(plan, block=block))
            where = "" if keep is None else f", over the {len(keep)} replicates where every compared arm brackets it"
            where += f", read along the {'key' if (args.along or plan.matched_along) == 'key' else 'axis'}"
            text = matched.text.replace("declared before the runs", "read where this script was told, after the runs")
            print(f"\nExploratory, at {axis} {x:g}{where}:\n{text}")
        for x in args.beta_path or ():
            print(f"\nExploratory, along {plan.block['frontier_key']}:\n{beta_path(runs, plan, x)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
