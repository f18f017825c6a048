"""What computing the output layer only at completion tokens saves in a GRPO (or DPO) step: ``bench_step.py``
with ``--full-logits`` (logits at every position, as before ``titan.token_logprobs(select_BT=...)``) and without,
in alternating whole processes (full, selected, full, selected, ...), each under ``flock`` of a lock file so
that heavy jobs sharing the machine do not run at once. Prints each process's JSON line (``output_layer``
says which), then the medians of step time, policy forward+backward, reference forward and peak RSS, and
the ratios selected / full (of the medians, and the median of each adjacent pair's ratio).

    python bench/bench_output_layer.py --repeats 3 -- --algo grpo --vocab 49152 --prompts 4 --group 4 \\
        --prompt-len 64 --new-tokens 64 --steps 3 --warmup 1 --threads 1

Everything after ``--`` goes to ``bench_step.py`` (one algorithm and one reference per call).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(step_args: list[str], full: bool, lock: str) -> dict:
    cmd = [sys.executable, os.path.join(HERE, "bench_step.py"), *step_args, "--worker",
           *(["--full-logits"] if full else [])]
    if lock:
        cmd = ["flock", lock, *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or len(rows) != 1:
        raise SystemExit(f"bench_step failed ({out.returncode}): {out.stderr[-3000:]}")
    return rows[0]


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, step_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3, help="processes per arm (alternating)")
    p.add_argument("--lock", default="/tmp/refexp-heavy.lock", help="flock this file around each process ('' : none)")
    args = p.parse_args(own)
    rows: dict[str, list[dict]] = {"full": [], "selected": []}
    for _ in range(args.repeats):
        for arm in ("full", "selected"):
            row = run(step_args, arm == "full", args.lock)
            print(json.dumps(row), flush=True)
            rows[arm].append(row)

    def value(row, key):
        return row[key] if "." not in key else row["phases_s"][key.split(".")[1]]

    def med(arm, key):
        return statistics.median(value(r, key) for r in rows[arm])

    keys = ("step_s", "phases.policy_fwd_bwd", "phases.reference_fwd", "phases.generation", "peak_rss_timed_mb")
    summary = {"bench": "output_layer", "repeats": args.repeats, "bench_step_args": step_args,
               **{arm: {k: round(med(arm, k), 4) for k in keys} for arm in rows},
               "selected_over_full": {k: round(med("selected", k) / med("full", k), 4) if med("full", k) else None
                                      for k in keys},
               # each selected process against the full one run just before it: less exposed to the load of
               # other jobs drifting over the whole measurement than the ratio of medians
               "paired_ratio_median": {k: round(statistics.median(value(s, k) / value(f, k) for f, s in
                                                                  zip(rows["full"], rows["selected"])), 4)
                                       for k in keys}}
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
