"""Probe of bench/gpu/gpu_check.py: a 3-step GRPO run through the CLI (gpu_smoke's ``fig_e2e``: the embedded
arithmetic task after a short SFT stage, a fixed reference, ``logger=none``) and where its steps' time went.

``grpo_3steps_s``
    Value: the run's wall seconds (process start, SFT stage and evaluations included). ``gen_s``,
    ``ref_fwd_s`` and ``policy_s``: sums over the 3 steps of ``perf/gen_s`` (generation), ``perf/ref_fwd_s``
    (reference forward) and the rest of ``perf/step_s`` (old log-probs, loss, backward, optimizer, reference
    update); ``*_share``: each over the summed ``perf/step_s``; ``per_step``: each step's parts (the first
    step pays kernel selection and, with ``rollout.static_decode``, compilation).
``rollout_logprob_diff``
    The run's ``rollout/logprob_diff`` (mean over completion tokens of |sampler's log-prob − trainer's|) averaged
    over the steps, in the run's compute dtype (bfloat16 on CUDA; ``--mixed-precision bfloat16`` on CPU), with
    ``rollout/logprob_diff_max``'s largest value.

    python bench/gpu/gpu_probe_grpo.py [--toy] [--budget-s N] [gpu_smoke.py's other options]
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # bench/gpu/ (these modules) and bench/ (_common.py)

import gpu_adapters as A  # noqa: E402
from gpu_probe import run_probe  # noqa: E402

FIGURES = ("grpo_3steps_s", "rollout_logprob_diff")
DIFF, DIFF_MAX = "rollout/logprob_diff", "rollout/logprob_diff_max"


def main(argv=None) -> dict:
    rows: list[dict] = []

    def fig_run(runner, bench) -> dict:
        from refexp.record.jsonl import read_rows
        from refexp.record.layout import METRICS

        bench.args.keep_run_dir = True  # its metrics are read here, then it goes
        out = bench.fig_e2e(runner.left())
        work = Path(out.pop("run_dir"))
        try:
            rows.extend(read_rows(work / "run" / METRICS))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        for k in ("step_s", "gen_s", "ref_fwd_s"):  # the last step's, from status.json: the sums below replace them
            out.pop(k, None)
        out["last_step_tokens_per_s"] = out.pop("tokens_per_s", None)
        split = A.phase_split(rows)
        step_s = split["step_s"]
        shares = {f"{k[:-2]}_share": round(split[k] / step_s, 4) for k in ("gen_s", "ref_fwd_s", "policy_s")}
        return {**out, **{k: round(v, 4) for k, v in split.items() if k != "per_step"}, **shares,
                "per_step": [{k: round(v, 4) for k, v in s.items()} for s in split["per_step"]],
                "compute_dtype": bench.compute_dtype()}

    def fig_diff(bench) -> dict:
        diffs = [r[DIFF] for r in rows if DIFF in r]
        if not diffs:
            raise RuntimeError(f"needs grpo_3steps_s's run, which failed, was skipped or logged no {DIFF}")
        return {"value": sum(diffs) / len(diffs), "unit": "nats", "per_step": diffs,
                "max": max(r.get(DIFF_MAX, float("nan")) for r in rows if DIFF in r),
                "compute_dtype": bench.compute_dtype()}

    def figures(runner, bench):
        runner.run("grpo_3steps_s", lambda: fig_run(runner, bench), min_left_s=bench.sizes.e2e_min_s)
        runner.run("rollout_logprob_diff", lambda: fig_diff(bench))

    return run_probe(FIGURES, figures, argv)


if __name__ == "__main__":
    main()
