"""Scaling figures: step time and memory against model size, sequence length and group size G, and
the per-rank memory of policy and reference under 2-process FSDP (torchrun, gloo).

Every point is one ``bench_step.py`` worker subprocess (its own peak RSS); the FSDP points run the
same worker under ``torchrun --standalone --nproc_per_node 2``, one thread per rank, next to a
single-process run of the same configuration with one thread. Prints the JSON line of every point
and one markdown table per sweep.

    OMP_WAIT_POLICY=PASSIVE python bench/scaling.py                 # all sweeps
    python bench/scaling.py --sweeps size fsdp --steps 2 --warmup 1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

STEP = str(C.BENCH_DIR / "bench_step.py")
SIZES = {  # name: (dim, layers, heads, ffn)
    "xs": (128, 2, 2, 256),
    "s": (256, 4, 4, 512),
    "m": (512, 6, 8, 1024),
    "l": (768, 8, 12, 2048),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweeps", nargs="+", default=["size", "seq", "group", "fsdp"],
                   choices=["size", "seq", "group", "fsdp"])
    p.add_argument("--sizes", nargs="+", default=["xs", "s", "m"], choices=list(SIZES))
    p.add_argument("--algos", nargs="+", default=["dpo", "grpo"], choices=["dpo", "grpo"])
    p.add_argument("--seq-lens", nargs="+", type=int, default=[32, 64, 128],
                   help="DPO: prompt = completion = this; GRPO: prompt 32, this many new tokens")
    p.add_argument("--groups", nargs="+", type=int, default=[2, 4, 8])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--fsdp-size", default="s", choices=list(SIZES))
    p.add_argument("--workdir", default=None)
    p.add_argument("--omp-wait-policy", default="PASSIVE", choices=["PASSIVE", "ACTIVE", "default"])
    p.add_argument("--in-process", action="store_true", help="run the single-process points in this process")
    p.add_argument("--shape-args", default="", help="extra bench_step.py options for every point (e.g. batch sizes)")
    return p.parse_args(argv)


def size_args(name: str) -> list[str]:
    d, n, h, f = SIZES[name]
    return ["--dim", str(d), "--layers", str(n), "--heads", str(h), "--ffn", str(f), "--vocab", "512"]


def point(args, extra: list[str], *, torchrun: int = 0) -> dict:
    argv = [STEP, "--worker", "--steps", str(args.steps), "--warmup", str(args.warmup), "--peak-seconds", "0.2",
            "--workdir", args.workdir, *extra, *args.shape_args.split()]
    if args.in_process and not torchrun:  # smoke tests: no subprocess (and no per-point peak RSS)
        import bench_step

        row = bench_step.main(argv[1:])[-1]
        return row
    if torchrun:
        argv = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(torchrun), *argv]
    rows = C.run_json_subprocess(argv)
    row = rows[-1]
    print(json.dumps(row), flush=True)
    return row


def table(title: str, cols: list[str], rows: list[list]) -> None:
    print(f"\n**{title}**\n")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(x) for x in r) + " |")
    sys.stdout.flush()


def main(argv=None) -> None:
    args = parse_args(argv)
    C.apply_omp_wait_policy(args.omp_wait_policy)
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="refexp-scaling-")
    th = ["--threads", str(args.threads)]

    if "size" in args.sweeps:
        rows = []
        for algo in args.algos:
            for s in args.sizes:
                r = point(args, ["--algo", algo, "--reference", "fixed", *size_args(s), *th])
                rows.append([algo, s, f"{r['policy_params'] / 1e6:.2f}M", r["step_s"], r["tokens_per_s"],
                             r["phases_s"]["generation"], r["phases_s"]["policy_fwd_bwd"],
                             r["phases_s"]["reference_fwd"], r["mfu"]["policy_fwd_bwd"], r["peak_rss_timed_mb"]])
        table("Model size (reference=fixed; DPO 8 pairs 32+32, GRPO 8x4, 32+32)",
              ["algo", "size", "params", "step s", "tokens/s", "generation s", "policy fwd+bwd s", "ref fwd s",
               "MFU train", "peak RSS MB"], rows)

    if "seq" in args.sweeps:
        rows = []
        for algo in args.algos:
            for L in args.seq_lens:
                shape = (["--prompt-len", str(L), "--completion-len", str(L)] if algo == "dpo"
                         else ["--prompt-len", "32", "--new-tokens", str(L)])
                r = point(args, ["--algo", algo, "--reference", "fixed", *size_args("s"), *shape, *th])
                rows.append([algo, L, r["step_s"], r["tokens_per_s"], r["gen_tokens_per_s"],
                             r["phases_s"]["generation"], r["phases_s"]["policy_fwd_bwd"],
                             r["phases_s"]["reference_fwd"], r["peak_rss_timed_mb"]])
        table("Sequence length (size s; DPO: prompt = completion = L; GRPO: prompt 32, L new tokens)",
              ["algo", "L", "step s", "tokens/s", "gen tok/s", "generation s", "policy fwd+bwd s", "ref fwd s",
               "peak RSS MB"], rows)

    if "group" in args.sweeps:
        rows = []
        for G in args.groups:
            r = point(args, ["--algo", "grpo", "--reference", "fixed", "--group", str(G), *size_args("s"), *th])
            rows.append([G, 8 * G, r["step_s"], r["gen_tokens_per_s"], r["phases_s"]["generation"],
                         r["phases_s"]["policy_fwd_bwd"], r["phases_s"]["reference_fwd"], r["peak_rss_timed_mb"]])
        table("GRPO group size G (size s, 8 prompts, 32 new tokens)",
              ["G", "rows", "step s", "gen tok/s", "generation s", "policy fwd+bwd s", "ref fwd s", "peak RSS MB"],
              rows)

    if "fsdp" in args.sweeps:
        init = Path(args.workdir) / f"fsdp-init-{args.fsdp_size}"
        if not (init / "sft.json").is_file():  # the weights both layouts start from
            import subprocess

            subprocess.run([sys.executable, "-c", (
                "import sys; sys.path.insert(0, %r); import _common as C; from refexp import titan; "
                "d, n, h, f = %r; s = C.Shape(d, n, h, f, 512); "
                "m = titan.build_model(s.model_config(128), vocab_size=None, device='cpu', requires_grad=False); "
                "C.save_init_checkpoint(m, __import__('pathlib').Path(%r))") % (str(C.BENCH_DIR),
                                                                                 SIZES[args.fsdp_size], str(init))],
                check=True, cwd=str(C.REPO))
        rows = []
        for algo, ref in (("dpo", "fixed"), ("grpo", "fixed"), ("grpo", "none")):
            common = ["--algo", algo, "--reference", ref, *size_args(args.fsdp_size), "--threads", "1",
                      "--init-dir", str(init)]
            single = point(args, common)
            fsdp = point(args, common, torchrun=2)
            for label, r in (("1 process", single), ("FSDP x2 (rank 0 / rank 1)", fsdp)):
                per = r.get("per_rank") or [r]
                rows.append([algo, ref, label,
                             " / ".join(f"{p['policy_params'] * 4 / 2**20:.1f}" for p in per),
                             " / ".join(f"{p['ref_params_resident'] * 4 / 2**20:.1f}" for p in per),
                             " / ".join(f"{p['peak_rss_timed_mb']:.0f}" for p in per), r["step_s"]])
        table(f"2-process FSDP (gloo, 1 thread per rank, size {args.fsdp_size}): per-rank memory",
              ["algo", "reference", "layout", "policy params MB", "reference params MB", "peak RSS MB (timed steps)",
               "step s"], rows)


if __name__ == "__main__":
    main()
