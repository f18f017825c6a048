"""Peak memory of one policy update: plain vs activation checkpointing vs micro-batching.

One update is what a GRPO/DPO step does to the policy: token log-probs of a batch of rows
(``titan.token_logprobs``), a mean loss, backward; with ``--micro`` rows at a time the rows go in chunks,
each chunk's loss weighted by its share of the rows, gradients accumulated (refexp/algos/microbatch.py).
Every configuration also reports the loss and gradient norm, which must agree across configurations.

Peak memory is measured, not estimated: on CUDA ``torch.cuda.max_memory_allocated`` over the update; on
CPU the peak resident set (VmHWM) during the update minus the resident set before it, each configuration
in its own process (a fresh heap), or in this one with ``--in-process`` (VmHWM reset between them).

    python bench/memory.py                       # CPU, default shape, 5 configurations
    python bench/memory.py --device cuda --dtype bfloat16

Prints one JSON line per configuration, then a ``summary`` line with each peak relative to ``plain``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common  # noqa: E402

CONFIGS = {
    "plain": {"ac": "none", "micro": False},
    "ac_full": {"ac": "full", "micro": False},
    "ac_selective": {"ac": "selective", "micro": False},
    "micro": {"ac": "none", "micro": True},
    "micro_ac_full": {"ac": "full", "micro": True},
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--rows", type=int, default=16, help="rows (completions) of the update")
    p.add_argument("--seq", type=int, default=512, help="tokens per row")
    p.add_argument("--micro", type=int, default=4, help="rows per chunk of the micro-batched configurations")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                   help="compute dtype (training.mixed_precision_param)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--in-process", action="store_true", help="all configurations in this process")
    p.add_argument("--one", choices=list(CONFIGS), help=argparse.SUPPRESS)  # a worker process
    return p.parse_args(argv)


def build(args, ac: str):
    from refexp import titan
    from refexp.config import ActivationCheckpointConfig, ModelConfig, TrainingConfig

    cfg = ModelConfig(name="llama3", flavor="debugmodel", dim=args.dim, n_layers=args.layers, n_heads=args.heads,
                      n_kv_heads=args.heads, ffn_hidden_dim=args.ffn, vocab_size=args.vocab, max_seq_len=args.seq)
    return titan.build_model(cfg, vocab_size=args.vocab, device=args.device,
                             training_cfg=TrainingConfig(mixed_precision_param=args.dtype),
                             ac_cfg=ActivationCheckpointConfig(mode=ac))


def update(model, tokens: torch.Tensor, micro: int | None) -> float:
    """Forward + backward of the mean token log-prob loss over ``tokens`` [B, T], in chunks of ``micro``
    rows (None: at once); returns the loss."""
    from refexp import titan
    from refexp.algos.microbatch import row_chunks

    B = tokens.shape[0]
    total = 0.0
    for sl in row_chunks(B, micro):
        loss = -titan.token_logprobs(model, tokens[sl]).mean()
        w = (sl.stop - sl.start) / B
        (loss * w).backward()
        total += loss.item() * w
    return total


def measure(args, name: str) -> dict:
    """One configuration: build, one warm-up update (lazy inits), then the measured update."""
    conf = CONFIGS[name]
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = build(args, conf["ac"])
    tokens = torch.randint(0, args.vocab, (args.rows, args.seq), generator=torch.Generator().manual_seed(1))
    tokens = tokens.to(device)
    micro = args.micro if conf["micro"] else None
    update(model, tokens, micro)
    model.zero_grad(set_to_none=False)  # gradients stay allocated: the measured update starts where a step does
    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        _common.malloc_trim()
        _common.reset_peak_rss()
        base = _common.rss_mb() * 2**20
    loss = update(model, tokens, micro)
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = _common.peak_rss_mb() * 2**20
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
    grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
    return {"config": name, "ac": conf["ac"], "micro_batch_size": micro, "rows": args.rows, "seq": args.seq,
            "device": args.device, "dtype": args.dtype,
            "peak_update_mb": round((peak - base) / 2**20, 1), "loss": loss, "grad_norm": grad_norm,
            "meter": "cuda max_memory_allocated" if device.type == "cuda" else "VmHWM - VmRSS"}


def worker_argv(args, name: str) -> list[str]:
    keep = ["--dim", args.dim, "--layers", args.layers, "--heads", args.heads, "--ffn", args.ffn, "--vocab",
            args.vocab, "--rows", args.rows, "--seq", args.seq, "--micro", args.micro, "--device", args.device,
            "--dtype", args.dtype, "--threads", args.threads]
    return [str(Path(__file__).resolve()), *map(str, keep), "--one", name]


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    _common.set_threads(args.threads)
    if args.one:
        print(json.dumps(measure(args, args.one)), flush=True)
        return []
    rows = []
    for name in args.configs:
        row = measure(args, name) if args.in_process else _common.run_json_subprocess(worker_argv(args, name))[-1]
        print(json.dumps(row), flush=True)
        rows.append(row)
    plain = next((r["peak_update_mb"] for r in rows if r["config"] == "plain"), None)
    if plain:
        print(json.dumps({"summary": {r["config"]: {"peak_update_mb": r["peak_update_mb"],
                                                    "vs_plain": round(r["peak_update_mb"] / plain, 3)}
                                      for r in rows}}), flush=True)
    return rows


if __name__ == "__main__":
    main()
