"""The two ways a shared-prompt row attends, timed against each other: the dense [U, S, S] mask and
``titan.CausalRows`` (causal attention over the usual rows gathered out of the shared ones), forward and
backward of the attention alone, on the layouts ``algos/shared_prompt.py`` builds for GRPO groups.

For each (prompts U, group G, prompt p, completion c): the shared row length S, both costs in query-key
pairs (mask: U x S^2; rows: N x T^2 with N = U x G usual rows of T = p + c), the median milliseconds of
each way over ``--reps``, which one ``attention="auto"`` picks (``GATHER_COST_PAIRS``), and what the
gathers cost in pairs per gathered position as this run measures it:
``(rows_ms / ms_per_pair - N x T^2) / (N x T)`` with ``ms_per_pair = mask_ms / (U x S^2)``; the constant
in ``shared_prompt.py`` is fitted on these. One JSON line per layout, then a markdown table with
``--markdown``. Not a timed test.

    OMP_WAIT_POLICY=ACTIVE python bench/bench_shared_attention.py --markdown
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

LAYOUTS = ["8x2x32x32", "8x4x32x32", "8x4x64x64", "8x2x32x128", "8x4x16x112", "8x8x32x64", "8x16x32x32",
           "8x16x8x8", "4x4x256x256", "2x16x64x256"]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layouts", nargs="+", default=LAYOUTS, help="UxGxPxC: prompts, group size, prompt and "
                   "completion tokens (default: the comparison's 8x4x32x32 and larger groups and rows)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--markdown", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    C.set_threads(args.threads)
    C.quiet_warnings()
    import torch
    import torch.nn.functional as F

    from refexp.algos.shared_prompt import GATHER_COST_PAIRS, share_groups

    rows_out = []
    for layout in args.layouts:
        U, G, p, c = (int(x) for x in layout.split("x"))
        g = torch.Generator().manual_seed(0)
        tokens = torch.randint(1, 100, (U * G, p + c), generator=g)
        tokens[:, :p] = torch.randint(1, 100, (U, p), generator=g).repeat_interleave(G, 0)
        mask = torch.zeros(U * G, p + c - 1, dtype=torch.bool)
        mask[:, p - 1:] = True
        dense = share_groups(tokens, mask, G, pad_id=0, attention="mask")
        gathered = share_groups(tokens, mask, G, pad_id=0, attention="rows")
        auto = share_groups(tokens, mask, G, pad_id=0)
        S, (N, T) = dense.tokens_US.shape[1], gathered.rows.gather_NT.shape
        q, k, v = (torch.randn(U, S, args.heads, args.head_dim, generator=g, requires_grad=True) for _ in range(3))
        grad = torch.randn(U, S, args.heads, args.head_dim, generator=g)
        allowed = dense.allowed_USS[:, None]

        def with_mask():
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 attn_mask=allowed)
            out.transpose(1, 2).backward(grad)

        def with_rows():
            gathered.rows.attend(q, k, v).backward(grad)

        times = {}
        for _ in range(2):  # warm-up
            with_mask(), with_rows()
        for name, fn in (("mask", with_mask), ("rows", with_rows)):
            walls = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                fn()
                walls.append((time.perf_counter() - t0) * 1e3)
            times[name] = C.median(walls)
        mask_pairs, rows_pairs = U * S * S, N * T * T
        ms_per_pair = times["mask"] / mask_pairs
        row = {"bench": "shared_attention", "layout": layout, "S": S, "N": N, "T": T, "threads": args.threads,
               "mask_pairs": mask_pairs, "rows_pairs": rows_pairs,
               "mask_ms": round(times["mask"], 3), "rows_ms": round(times["rows"], 3),
               "rows_over_mask": round(times["rows"] / times["mask"], 3),
               "auto_picks": "rows" if auto.rows is not None else "mask",
               "faster": "rows" if times["rows"] < times["mask"] else "mask",
               "gather_cost_pairs_measured": round((times["rows"] / ms_per_pair - rows_pairs) / (N * T), 1),
               "gather_cost_pairs_used": GATHER_COST_PAIRS}
        rows_out.append(row)
        print(json.dumps(row), flush=True)
    if args.markdown:
        print("\n| U x G x p x c | S | mask ms | rows ms | rows / mask | faster | auto picks | gather cost (pairs) |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows_out:
            print(f"| {r['layout']} | {r['S']} | {r['mask_ms']:.2f} | {r['rows_ms']:.2f} | {r['rows_over_mask']:.2f} | "
                  f"{r['faster']} | {r['auto_picks']} | {r['gather_cost_pairs_measured']:.0f} |")
    return rows_out


if __name__ == "__main__":
    main()
