"""What one decoded token costs: ms/token and operators/token of ``sampler.generate``, per decode path.

The workload is the comparison's GRPO generation (``compare_trl.py``): a randomly initialised llama3 of the
given shape, ``rows / group`` distinct random prompts of ``--prompt-len`` words, each sampled ``group``
times, ``--new-tokens`` new tokens with the EOS id outside the vocabulary (no row stops early). For each
row count and path, in one process and alternated round by round (so both paths meet the same load):

- ``ms_per_token``: (time of a generation of 1 + N tokens - time of a 1-token generation) / N, the median
  over ``--rounds``: the decode loop alone (prefill, cache set-up and the training-layout copy cancel);
- ``ops_per_token``: the same difference in top-level ``aten::`` operators counted by ``torch.profiler``
  (the operators a step dispatches; on GPU each is at least one kernel launch), with the top operators.

Paths: ``plain`` (the one-token step over plain weights, ``refexp/titan/decode_step_plain.py``, what a
single-process or FSDP model decodes with) and ``modules`` (the decoder's sub-modules, what TP decodes
with; the path every model took before the plain step: run with ``--paths modules`` and an older checkout
first on ``PYTHONPATH`` for the code before it). ``--lora-rank R``: a LoRA policy, adapters of rank R on every
linear layer of the blocks (B drawn non-zero, so that they change the tokens), decoded in its policy view; its
``modules`` path is what a LoRA policy decoded with before the plain step took adapters. One JSON line per (rows,
path), then a markdown table with
``--markdown``. Not a timed test. OpenMP reads ``OMP_WAIT_POLICY`` at start-up, so set it in the
environment (bench/README.md: ACTIVE on a quiet machine, PASSIVE on a shared one).

    OMP_WAIT_POLICY=ACTIVE python bench/bench_decode.py --rows 32 128 --threads 2 --markdown
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

PATHS = ("modules", "plain")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[32, 128])
    p.add_argument("--group", type=int, default=4, help="completions per prompt (rows / group distinct prompts)")
    p.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--lora-rank", type=int, default=0, help="adapters of this rank on every linear layer of the "
                                                             "blocks (0: none)")
    C.add_shape_args(p)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--top", type=int, default=6, help="operators listed per configuration")
    p.add_argument("--markdown", action="store_true")
    return p.parse_args(argv)


def _use_path(path: str):
    """Force a decode path for the generations that follow; returns the undo. A tree without the plain
    step (``--paths modules`` on an older checkout, for a before/after) decodes through the modules anyway."""
    try:
        from refexp.titan import decode_step_plain
    except ImportError:
        if path != "modules":
            raise
        return lambda: None

    original = decode_step_plain.PlainStepWeights.of
    if path == "modules":
        decode_step_plain.PlainStepWeights.of = staticmethod(lambda decoder, **kw: None)

    def undo():
        decode_step_plain.PlainStepWeights.of = original
    return undo


def _top_level_ops(prof) -> tuple[collections.Counter, collections.Counter]:
    """Counts and self+children CPU time (us) of the aten operators not called from another aten operator."""
    counts, times = collections.Counter(), collections.Counter()
    for e in prof.events():
        parent = e.cpu_parent
        if e.name.startswith("aten::") and not (parent is not None and parent.name.startswith("aten::")):
            counts[e.name] += 1
            times[e.name] += e.cpu_time_total
    return counts, times


def main(argv=None) -> None:
    args = parse_args(argv)
    C.set_threads(args.threads)
    C.quiet_warnings()
    import torch

    from refexp import titan
    from refexp.components import sampler
    from refexp.config.model import LoRAConfig
    shape = C.shape_from_args(args)
    lora = LoRAConfig(rank=args.lora_rank) if args.lora_rank else None
    model = titan.build_model(shape.model_config(args.prompt_len + args.new_tokens + 1), vocab_size=None,
                              device="cpu", requires_grad=False, lora=lora)
    model.eval()
    if lora is not None:  # B starts at 0 (the policy is the base): move it, as training would
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for m in titan.lora.adapted_modules(model).values():
                m.lora_b.weight.copy_(0.02 * torch.randn(m.lora_b.weight.shape, generator=gen))
    tok = C.make_tokenizer(args.vocab, eos_outside=True)
    n = args.new_tokens

    def generate(rows: int, new_tokens: int):
        texts = C.random_texts(rows // args.group, args.prompt_len, args.vocab, seed=0, eos_outside=True)
        prompts = [t for t in texts for _ in range(args.group)]
        keys = [(0, 1, i) for i in range(len(prompts))]
        return sampler.generate(model, tok, prompts, max_new_tokens=new_tokens, keys=keys)

    results = []
    for rows in args.rows:
        ms = {p: [] for p in args.paths}
        outputs = {}
        for r in range(args.rounds + 1):  # round 0 warms up
            for path in args.paths:
                undo = _use_path(path)
                try:
                    t0 = time.perf_counter()
                    generate(rows, 1)
                    t1 = time.perf_counter()
                    out = generate(rows, 1 + n)
                    t2 = time.perf_counter()
                finally:
                    undo()
                outputs[path] = out
                if r:
                    ms[path].append(((t2 - t1) - (t1 - t0)) / n * 1e3)
        same = len({tuple(map(tuple, o.completion_ids)) for o in outputs.values()}) == 1
        for path in args.paths:
            undo = _use_path(path)
            try:
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as long:
                    generate(rows, 1 + n)
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as short:
                    generate(rows, 1)
            finally:
                undo()
            (c_long, t_long), (c_short, t_short) = _top_level_ops(long), _top_level_ops(short)
            per_op = {k: (c_long[k] - c_short.get(k, 0)) / n for k in c_long}
            top = sorted(per_op, key=lambda k: -(t_long[k] - t_short.get(k, 0)))[: args.top]
            row = {"bench": "decode", "rows": rows, "path": path, "threads": args.threads, "lora_rank": args.lora_rank,
                   "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(default)"),
                   "ms_per_token": round(C.median(ms[path]), 3), "ms_per_token_rounds": [round(x, 3) for x in ms[path]],
                   "ops_per_token": round(sum(c_long.values()) - sum(c_short.values())) / n,
                   "top_ops": {k: {"per_token": round(per_op[k], 1),
                                   "ms_per_token_profiled": round((t_long[k] - t_short.get(k, 0)) / n / 1e3, 3)}
                               for k in top},
                   "same_tokens_every_path": same}
            results.append(row)
            print(json.dumps(row), flush=True)
    if args.markdown:
        print("\n| rows | path | ms/token (median) | operators/token | vs modules |")
        print("|---|---|---|---|---|")
        base = {r["rows"]: r["ms_per_token"] for r in results if r["path"] == "modules"}
        for r in results:
            rel = f"{r['ms_per_token'] / base[r['rows']]:.2f}" if r["rows"] in base else "–"
            print(f"| {r['rows']} | {r['path']} | {r['ms_per_token']:.2f} | {r['ops_per_token']:.0f} | {rel} |")


if __name__ == "__main__":
    main()
