"""Where the time of each phase goes: torch.profiler over refexp's own functions for the phases of a
step (policy forward+backward = ``titan.token_logprobs`` + backward, reference forward, generation =
``sampler.generate``), with the GEMMs' achieved rate against the matmul peak measured in the same run.

For each phase: wall time (median of ``--reps``), then one profiled repetition split into GEMMs
(aten::mm/addmm/bmm: count, time, GFLOP/s from their shapes, share of the peak), attention (SDPA
kernels), the other aten ops, and time outside any op (Python, dispatch), plus the top ops. This is
what bench/README.md cites for the targets that were not reached.

    OMP_WAIT_POLICY=PASSIVE python bench/profile_phases.py                  # the TRL-comparison shapes
    OMP_WAIT_POLICY=PASSIVE python bench/profile_phases.py --compile --phases policy_dpo policy_grpo
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

GEMMS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
ATTENTION = ("aten::_scaled_dot_product_flash_attention_for_cpu",
             "aten::_scaled_dot_product_flash_attention_for_cpu_backward")
PHASES = ("policy_dpo", "reference_dpo", "policy_grpo", "reference_grpo", "generation")


def gemm_flops(name: str, shapes) -> float:
    try:
        if name == "aten::mm":
            (m, k), (_, n) = shapes[0], shapes[1]
            return 2.0 * m * k * n
        if name == "aten::addmm":
            (m, k), (_, n) = shapes[1], shapes[2]
            return 2.0 * m * k * n
        if name in ("aten::bmm", "aten::baddbmm"):
            a, b = (shapes[0], shapes[1]) if name == "aten::bmm" else (shapes[1], shapes[2])
            return 2.0 * a[0] * a[1] * a[2] * b[2]
    except (IndexError, TypeError, ValueError):
        pass
    return 0.0


def analyse(prof, wall_s: float, peak_gflops: float, top: int) -> dict:
    rows = defaultdict(lambda: [0, 0.0, 0.0])  # name -> calls, self seconds, flops
    for e in prof.events():
        if e.device_type.name != "CPU" or not e.name.startswith("aten::"):
            continue
        r = rows[e.name]
        r[0] += 1
        r[1] += e.self_cpu_time_total / 1e6
        if e.name in GEMMS:
            r[2] += gemm_flops(e.name, e.input_shapes)
    ops_s = sum(r[1] for r in rows.values())
    gemm_s = sum(rows[n][1] for n in GEMMS if n in rows)
    gemm_flops_total = sum(rows[n][2] for n in GEMMS if n in rows)
    attn_s = sum(rows[n][1] for n in ATTENTION if n in rows)
    ranked = sorted(rows.items(), key=lambda kv: -kv[1][1])[:top]
    return {
        "profiled_wall_s": round(wall_s, 4),
        "gemm": {"calls": sum(rows[n][0] for n in GEMMS if n in rows), "s": round(gemm_s, 4),
                 "share_of_wall": round(gemm_s / wall_s, 3),
                 "gflops": round(gemm_flops_total / gemm_s / 1e9, 1) if gemm_s else None,
                 "fraction_of_peak": round(gemm_flops_total / gemm_s / 1e9 / peak_gflops, 3) if gemm_s else None},
        "attention_s": round(attn_s, 4), "attention_share": round(attn_s / wall_s, 3),
        "other_ops_s": round(ops_s - gemm_s - attn_s, 4),
        "other_ops_share": round((ops_s - gemm_s - attn_s) / wall_s, 3),
        "outside_ops_s": round(max(0.0, wall_s - ops_s), 4),
        "outside_ops_share": round(max(0.0, wall_s - ops_s) / wall_s, 3),
        "top_ops": [{"op": n, "calls": r[0], "self_s": round(r[1], 4)} for n, r in ranked],
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phases", nargs="+", default=list(PHASES), choices=PHASES)
    C.add_shape_args(p)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--compile", action="store_true", help="per-block torch.compile (compile.enable)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--top", type=int, default=8)
    args = p.parse_args(argv)

    C.set_threads(args.threads)
    C.quiet_warnings()
    import torch

    from refexp import titan
    from refexp.components import sampler
    from refexp.config import CompileConfig

    shape = C.shape_from_args(args)
    model = titan.build_model(shape.model_config(128), vocab_size=None, device="cpu",
                              compile_cfg=CompileConfig(enable=args.compile))
    frozen = titan.build_model(shape.model_config(128), vocab_size=None, device="cpu", requires_grad=False,
                               compile_cfg=CompileConfig(enable=args.compile))
    g = torch.Generator().manual_seed(0)
    dpo_x = torch.randint(2, args.vocab, (16, 64), generator=g)  # 8 pairs x (32 prompt + 32 completion)
    grpo_x = torch.randint(1, args.vocab, (32, 64), generator=g)  # 8 x 4 rows x (32 + 32)
    tok = C.make_tokenizer(args.vocab, eos_outside=True)
    prompts = [t for t in C.random_texts(8, 32, args.vocab, seed=0, eos_outside=True) for _ in range(4)]
    keys = [(0, 1, i) for i in range(32)]

    def policy(x, entropy):
        def run():
            model.train()
            out = titan.token_logprobs(model, x, with_entropy=entropy)
            (out[0] if entropy else out).sum().backward()
            model.zero_grad(set_to_none=True)
        return run

    def reference(x):
        def run():
            with torch.inference_mode():
                titan.token_logprobs(frozen, x)
        return run

    def generation():
        model.eval()
        sampler.generate(model, tok, prompts, max_new_tokens=32, keys=keys)
        model.train()

    fns = {"policy_dpo": (policy(dpo_x, False), 3 * shape.forward_flops([64] * 16)),
           "reference_dpo": (reference(dpo_x), shape.forward_flops([64] * 16)),
           "policy_grpo": (policy(grpo_x, True), 3 * shape.forward_flops([64] * 32)),
           "reference_grpo": (reference(grpo_x), shape.forward_flops([64] * 32)),
           "generation": (generation, shape.decode_flops(32, 32, 32))}
    peak = C.matmul_peak()
    for name in args.phases:
        fn, flops = fns[name]
        for _ in range(2):
            fn()
        walls = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            fn()
            walls.append(time.perf_counter() - t0)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
            t0 = time.perf_counter()
            fn()
            wall = time.perf_counter() - t0
        peak_now = max(peak["gflops"], C.matmul_peak(sizes=(1024,), seconds=0.0)["gflops"])
        wall_med = C.median(walls)
        out = {"bench": "profile_phase", "phase": name, "compile": args.compile, "threads": args.threads,
               "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(default)"),
               "wall_s_median": round(wall_med, 4), "model_gflop": round(flops / 1e9, 3),
               "mfu": round(flops / wall_med / 1e9 / peak_now, 3), "matmul_peak_gflops": round(peak_now, 1),
               **analyse(prof, wall, peak_now, args.top)}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
