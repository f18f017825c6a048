"""What one training step costs, per algorithm and reference strategy, on random-token data.

Drives refexp's real step functions (``GRPOStep``, ``DPOStep``) built the way ``train_grpo`` /
``train_dpo`` build them (``build_policy``, ``build_strategy``, ``build_ref_source`` and the
refcache), on a randomly initialised llama3 of the given shape, and prints one JSON line per
configuration: steps/s, tokens/s (generated tokens/s for GRPO), the per-step phase breakdown
(generation, policy forward+backward, reference forward, reference update, optimizer, other),
peak RSS, and model FLOPs utilisation against a float32 matmul peak measured in the same process.

Each configuration runs in its own subprocess (peak RSS is per process); ``--in-process`` runs
them in this one (for profiling). Not a timed test: numbers on a shared machine are noisy, compare
ratios measured in one run.

    python bench/bench_step.py --algo grpo --reference fixed none ema periodic_reset
    python bench/bench_step.py --algo dpo --reference fixed none --precompute-ref both
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algo", nargs="+", default=["grpo"], choices=["grpo", "dpo"])
    p.add_argument("--reference", nargs="+", default=["fixed"],
                   choices=["fixed", "periodic_reset", "ema", "kl_triggered", "none"])
    p.add_argument("--precompute-ref", nargs="?", const="on", default="off", choices=["off", "on", "both"],
                   help="DPO: reference log-probs from the refcache (on), live (off), or both configurations")
    p.add_argument("--no-share-prompt", dest="share_prompt", action="store_false",
                   help="one row per completion (the prompt run once per completion) instead of refexp's default "
                        "one row per prompt (algo.share_prompt)")
    p.add_argument("--loss", default=None, help="DPO loss_type (default sigmoid; simpo with --reference none)")
    p.add_argument("--beta", type=float, default=None, help="GRPO 0.04 / DPO 0.1 by default; GRPO none: 0")
    # model shape
    C.add_shape_args(p)
    # batch shape
    p.add_argument("--prompts", type=int, default=8, help="GRPO prompts per step")
    p.add_argument("--group", type=int, default=4, help="GRPO completions per prompt (G)")
    p.add_argument("--new-tokens", type=int, default=32, help="GRPO tokens generated per completion")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--pairs", type=int, default=8, help="DPO pairs per step")
    p.add_argument("--completion-len", type=int, default=32, help="DPO chosen/rejected tokens (EOS included)")
    # strategy knobs (each strategy gets only its own: see reference_config)
    p.add_argument("--reset-every", type=int, default=4, help="periodic_reset: reference.reset_every")
    p.add_argument("--sync-every", type=int, default=1, help="ema: reference.sync_every")
    p.add_argument("--ema-alpha", type=float, default=0.1, help="ema: reference.alpha")
    # run
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--lora-rank", type=int, default=0,
                   help="GRPO with model.lora: adapters of this rank on every linear layer of the blocks (0: the "
                        "whole model trains); the FLOP counts have no weight gradients of the frozen base")
    p.add_argument("--lora-alpha", type=float, default=None, help="model.lora.alpha (default: the rank)")
    p.add_argument("--compile", action="store_true", help="per-block torch.compile of policy and reference")
    p.add_argument("--full-logits", action="store_true",
                   help="the output layer at every position, as before select_BT (titan.logprobs.SELECT_POSITIONS "
                        "= False): what computing logits only at completion tokens saves (bench/bench_output_layer.py)")
    p.add_argument("--what-if-fused-adamw", action="store_true",
                   help="replace refexp's foreach AdamW by torch's fused CPU kernel (an experiment, see README)")
    p.add_argument("--workdir", default=None, help="init checkpoint + refcache (default: a temporary dir)")
    p.add_argument("--init-dir", default=None, help="start from this refexp checkpoint dir instead of a fresh init")
    p.add_argument("--hf-dir", default=None,
                   help="a pretrained HF checkpoint dir (e.g. SmolLM2's converted dir): its shapes, weights and "
                        "tokenizer replace the random model (the shape options are ignored), prompts are words of "
                        "its vocabulary")
    p.add_argument("--in-process", action="store_true", help="run every configuration in this process")
    p.add_argument("--profile", default=None, help="write a torch.profiler table of the timed steps to this file")
    p.add_argument("--peak-seconds", type=float, default=0.4, help="time spent per matmul-peak size")
    p.add_argument("--peak-sizes", type=int, nargs="+", default=[1024, 2048], help="square GEMM sizes of the peak")
    p.add_argument("--no-probe-peak", dest="probe_peak", action="store_false",
                   help="skip the short 1024^2 matmul probe before every step (mfu_adjacent)")
    p.add_argument("--markdown", action="store_true", help="also print a markdown table (stderr)")
    p.add_argument("--omp-wait-policy", default="PASSIVE", choices=["PASSIVE", "ACTIVE", "default"],
                   help="OMP_WAIT_POLICY of the worker subprocesses (default PASSIVE: see bench/README.md)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def configurations(args) -> list[dict]:
    out = []
    pre = {"off": [False], "on": [True], "both": [False, True]}[args.precompute_ref]
    for algo, ref in itertools.product(args.algo, args.reference):
        for p in (pre if algo == "dpo" else [False]):
            if algo == "dpo" and ref == "none" and p:
                continue  # nothing to precompute
            out.append({"algo": algo, "reference": ref, "precompute_ref": p})
    return out


# ---------------------------------------------------------------- one configuration
def build(args, algo: str, reference: str, precompute: bool):
    """(ctx, policy, strategy, step_fn, meta) built with refexp's own constructors."""
    import datasets
    import torch

    from refexp import titan
    from refexp.config import (
        CheckpointConfig,
        CompileConfig,
        DPOConfig,
        GRPOConfig,
        ModelConfig,
        RootConfig,
        TrainingConfig,
    )
    from refexp.config.model import LoRAConfig
    from refexp.tasks import Task

    device = titan.resolve_device(args.device)
    shape = C.shape_from_hf(args.hf_dir) if args.hf_dir else C.shape_from_args(args)
    args.vocab = shape.vocab
    n_steps = args.warmup + args.steps
    if algo == "grpo":
        seq = args.prompt_len + args.new_tokens
        tok = tokenizer(args, eos_outside=True)
        prompts = texts(args, args.prompts * n_steps, args.prompt_len, seed=args.seed, eos_outside=True)
        train = datasets.Dataset.from_dict({"prompt": prompts, "completion": [""] * len(prompts),
                                            "answer": [""] * len(prompts)})
        beta = args.beta if args.beta is not None else (0.0 if reference == "none" else 0.04)
        algo_cfg = GRPOConfig(prompts_per_step=args.prompts, group_size=args.group, beta=beta,
                              max_new_tokens=args.new_tokens, loss_agg="grpo", share_prompt=args.share_prompt)
        pairs = None
    else:
        seq = args.prompt_len + args.completion_len
        tok = tokenizer(args, eos_outside=False)
        n = args.pairs * n_steps
        cols = [texts(args, n, L, seed=args.seed + k, eos_outside=False)
                for k, L in enumerate((args.prompt_len, args.completion_len - 1, args.completion_len - 1))]
        pairs = datasets.Dataset.from_dict({"prompt": cols[0], "chosen": cols[1], "rejected": cols[2]})
        train = datasets.Dataset.from_dict({"prompt": cols[0][:1], "completion": [""], "answer": [""]})
        loss = args.loss or ("simpo" if reference == "none" else "sigmoid")
        algo_cfg = DPOConfig(loss_type=loss, beta=args.beta if args.beta is not None else 0.1,
                             pairs_per_step=args.pairs, precompute_ref=precompute, num_pairs=n,
                             share_prompt=args.share_prompt)
    task = Task(name="random", tokenizer=tok, train=train, eval=train, max_new_tokens=args.new_tokens,
                reward=C.content_blind_reward, max_prompt_len=args.prompt_len, preference=pairs)
    if args.lora_rank and algo != "grpo":
        raise SystemExit(f"--lora-rank is for --algo grpo (model.lora trains GRPO's policy), not {algo}")
    model_cfg = (ModelConfig(name="llama3", hf_assets_path=args.hf_dir, max_seq_len=seq + 1) if args.hf_dir
                 else shape.model_config(max_seq_len=max(64, seq + 1)))
    model_cfg.lora = LoRAConfig(rank=args.lora_rank, alpha=args.lora_alpha)
    cfg = RootConfig(
        model=model_cfg,
        training=TrainingConfig(steps=n_steps, seed=args.seed, lr=args.lr, num_threads=args.threads,
                                device=args.device),
        checkpoint=CheckpointConfig(enable=False),
        compile=CompileConfig(enable=args.compile),
        algo=algo_cfg,
        reference=reference_config(args, reference),
    )
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="refexp-bench-"))
    ctx = C.make_context(cfg, task, workdir, device)

    from refexp.algos.loop import build_policy, build_strategy, reference_path

    if args.init_dir or args.hf_dir:
        init_dir = Path(args.init_dir or args.hf_dir)
    elif ctx.dist.world_size > 1:
        raise SystemExit("bench_step under torchrun needs --init-dir (write it with a single-process run first)")
    else:
        key = f"init-{shape.dim}-{shape.layers}-{shape.heads}-{shape.kv_heads}-{shape.ffn}-{shape.vocab}-s{args.seed}"
        init_dir = workdir / key
        if not (init_dir / "sft.json").is_file():
            from refexp.components.models import build_run_model

            model = build_run_model(ctx, trainable=False)
            C.save_init_checkpoint(model, init_dir)
            del model
    policy = build_policy(ctx, init_dir)
    if args.what_if_fused_adamw:
        policy.optimizers, policy.lr_schedulers = fused_adamw(policy.model, cfg.training)
    meta = {"optimizer_impl": ("fused (what-if)" if args.what_if_fused_adamw
                               else "refexp.components.optim (foreach on CPU)")}
    if algo == "grpo":
        from refexp.algos.grpo import GRPOStep

        strategy, _ = build_strategy(ctx, init_dir, policy=policy.model)
        step_fn = GRPOStep(ctx, policy, strategy)
    else:
        from refexp.algos.dpo import DPOStep, build_ref_source

        strategy, _ = build_strategy(ctx, init_dir, defer_build=True)
        t0 = time.perf_counter()
        ref_source, stats = build_ref_source(ctx, strategy, pairs, reference_path(ctx, init_dir))
        meta["ref_source"] = type(ref_source).__name__ if ref_source is not None else None
        meta["ref_source_build_s"] = time.perf_counter() - t0
        meta.update(stats)
        step_fn = DPOStep(ctx, policy, strategy, pairs, ref_source, stats)
    torch.manual_seed(args.seed)
    return ctx, policy, strategy, step_fn, shape, meta


def tokenizer(args, *, eos_outside: bool):
    """The checkpoint's tokenizer with ``--hf-dir``, else the word-level one over ``--vocab`` ids."""
    if args.hf_dir:
        return C.pretrained_tokenizer(args.hf_dir, eos_outside=eos_outside)
    return C.make_tokenizer(args.vocab, eos_outside=eos_outside)


def texts(args, n: int, length: int, *, seed: int, eos_outside: bool) -> list[str]:
    """n prompts/completions of ``length`` tokens: words of the checkpoint's vocabulary with ``--hf-dir``."""
    if args.hf_dir:
        return C.word_texts(args.hf_dir, n, length, seed=seed)
    return C.random_texts(n, length, args.vocab, seed=seed, eos_outside=eos_outside)


def reference_config(args, reference: str):
    """``reference``'s own schema with the knobs it has (``--reset-every`` only reaches periodic_reset, ...)."""
    from dataclasses import fields

    from refexp.config import REFERENCE_SCHEMAS

    schema = REFERENCE_SCHEMAS[reference]
    knobs = {"reset_every": args.reset_every, "sync_every": args.sync_every, "alpha": args.ema_alpha}
    own = {f.name for f in fields(schema)}
    return schema(**{k: v for k, v in knobs.items() if k in own})


class Bench:
    """One configuration, built with refexp's constructors; ``step(i)`` runs step i the way the loop does
    (the step function, then the reference strategy's update) and returns its timings."""

    def __init__(self, args, algo: str, reference: str, precompute: bool):
        C.set_threads(args.threads)
        C.quiet_warnings()
        if args.full_logits:
            from refexp.titan import logprobs

            logprobs.SELECT_POSITIONS = False
        self.args, self.algo = args, algo
        t0 = time.perf_counter()
        self.ctx, self.policy, self.strategy, self.step_fn, self.shape, self.meta = build(args, algo, reference,
                                                                                         precompute)
        self.build_s = time.perf_counter() - t0
        self.clock = C.PhaseClock(self.policy.model, self.policy.optimizers)

    def step(self, step: int) -> dict:
        from refexp.components.optim import reset_optimizer_state

        probe = C.matmul_peak(sizes=(1024,), seconds=0.0, warmup=1)["gflops"] if self.args.probe_peak else None
        self.clock.take()
        t0 = time.perf_counter()
        m = self.step_fn(step, None)
        t1 = time.perf_counter()
        self.strategy.after_step(step, self.policy.model, m)
        if self.strategy.reset_optimizer_requested:
            reset_optimizer_state(self.policy.optimizers)
            self.strategy.reset_optimizer_requested = False
        t2 = time.perf_counter()
        fwd_bwd, opt = self.clock.take()
        gen = m.get("perf/gen_s", 0.0)
        ref = m.get("perf/ref_fwd_s", 0.0)
        return {"step_s": t2 - t0, "generation": gen, "policy_fwd_bwd": fwd_bwd, "reference_fwd": ref,
                "ref_update": t2 - t1, "optimizer": opt, "other": (t1 - t0) - gen - ref - fwd_bwd - opt,
                "completion_len": m.get("policy/completion_len"), "probe_gflops": probe}

    def flops(self, timed: list[dict]) -> dict:
        """Tokens and model FLOPs of one step on this rank, and the positions its training forward runs."""
        a, shape = self.args, self.shape
        from refexp import titan
        from refexp.runtime.distributed import dp_rank_and_degree

        world = dp_rank_and_degree(self.ctx.parallel_dims)[1]
        live_ref = self.strategy.holds_model and C.median([r["reference_fwd"] for r in timed]) > 1e-3
        if self.algo == "grpo":
            rows_n = a.prompts * a.group // world
            clen = C.median([r["completion_len"] for r in timed]) or a.new_tokens
            # executed FLOPs (C.grpo_step_flops): shared rows, the output layer where it runs, LoRA's frozen
            # weights without weight gradients (tokens/s still counts G x (prompt + completion) tokens, as TRL's)
            lora = self.ctx.cfg.model.lora.rank > 0
            fl = C.grpo_step_flops(
                shape, prompts=rows_n // a.group, group=a.group, prompt_len=a.prompt_len,
                new_tokens=int(round(clen)), shared_prompt=bool(self.ctx.cfg.algo.share_prompt),
                output_layer="all" if a.full_logits else "completions", reference=live_ref,
                adapter_params=titan.lora.count_adapter_parameters(self.policy.model) if lora else 0)
            return {"train_tokens": rows_n * (a.prompt_len + int(round(clen))), "gen_tokens": rows_n * clen, **fl}
        rows_n = 2 * a.pairs // world
        T = a.prompt_len + a.completion_len
        # the output layer runs where a completion token is predicted (DPOStep's select_BT: completion_len of
        # each chosen and rejected row), or everywhere under --full-logits
        head = None if a.full_logits else rows_n * a.completion_len
        seqs = [T] * rows_n
        if self.ctx.cfg.algo.share_prompt:
            # executed FLOPs: one row per prompt of prompt + its 2 completions + 1 bridge (tokens/s
            # still counts 2 x (prompt + completion) tokens, as TRL's does)
            seqs = [a.prompt_len + 2 * (T - a.prompt_len + 1) - 1] * (rows_n // 2)
        fwd = shape.forward_flops(seqs, lm_head_positions=head)
        return {"train_tokens": rows_n * T, "gen_tokens": 0, "generation": 0.0,
                "policy_fwd_bwd": 3 * fwd, "reference_fwd": fwd if live_ref else 0.0,
                "trunk_positions": sum(seqs), "output_layer_positions": sum(seqs) if head is None else head}

    def summary(self, timed: list[dict], *, peak: float, peak_by_size: dict, peak_rss_timed: float | None,
                warmup: list[dict] = ()) -> dict:
        from refexp import titan

        a, ctx, strategy = self.args, self.ctx, self.strategy
        phases = [k for k in timed[0] if k not in ("completion_len", "probe_gflops", "step_s")]
        med = {k: C.median([r[k] for r in timed]) for k in ["step_s", *phases]}
        step_s = med["step_s"]
        fl = self.flops(timed)
        step_flops = fl["generation"] + fl["policy_fwd_bwd"] + fl["reference_fwd"]

        def mfu(flops, seconds, gflops=peak):
            return round(flops / seconds / (gflops * 1e9), 4) if seconds and seconds > 0 and flops else None

        def mfu_adjacent(flops, key):  # each step against the matmul probe run right before it
            if not flops or timed[0]["probe_gflops"] is None:
                return None
            return C.median([mfu(flops, r[key], r["probe_gflops"]) for r in timed])

        ref_params = titan.count_parameters(strategy.model) if strategy.model is not None else 0
        if strategy.model is self.policy.model:  # model.lora: the reference's own part of the policy, if any
            ref_params = titan.lora.count_adapter_parameters(self.policy.model, reference=True)
        out = {
            "bench": "step", "algo": self.algo, "reference": strategy.name,
            "precompute_ref": bool(getattr(ctx.cfg.algo, "precompute_ref", False)) and self.algo == "dpo",
            "loss": ctx.cfg.algo.loss_type if self.algo == "dpo" else "grpo", "beta": ctx.cfg.algo.beta,
            "share_prompt": bool(ctx.cfg.algo.share_prompt), "output_layer": "full" if a.full_logits else "selected",
            "shape": {"dim": self.shape.dim, "layers": self.shape.layers, "heads": self.shape.heads,
                      "kv_heads": self.shape.kv_heads, "ffn": self.shape.ffn, "vocab": self.shape.vocab},
            "hf_dir": a.hf_dir,
            "batch": ({"prompts": a.prompts, "group": a.group, "prompt_len": a.prompt_len, "new_tokens": a.new_tokens}
                      if self.algo == "grpo" else
                      {"pairs": a.pairs, "prompt_len": a.prompt_len, "completion_len": a.completion_len}),
            "threads": a.threads, "device": str(ctx.device), "compile": a.compile, "steps": len(timed),
            "warmup": a.warmup, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(default)"),
            "step_s": round(step_s, 5), "steps_per_s": round(1 / step_s, 4),
            "tokens_per_s": round(fl["train_tokens"] / step_s, 1),
            "gen_tokens_per_s": (round(fl["gen_tokens"] / med["generation"], 1)
                                 if self.algo == "grpo" and med["generation"] else None),
            "phases_s": {k: round(med[k], 5) for k in phases},
            "step_s_all": [round(r["step_s"], 4) for r in timed],
            "warmup_step_s": [round(r["step_s"], 3) for r in warmup],  # with --compile: the compile time
            "ref_fwd_over_policy_fwd_bwd": (round(med["reference_fwd"] / med["policy_fwd_bwd"], 4)
                                            if med["policy_fwd_bwd"] else None),
            "matmul_peak_gflops": round(peak, 1), "matmul_peak_by_size": peak_by_size,
            "mfu": {"policy_fwd_bwd": mfu(fl["policy_fwd_bwd"], med["policy_fwd_bwd"]),
                    "policy_fwd_bwd_opt": mfu(fl["policy_fwd_bwd"], med["policy_fwd_bwd"] + med["optimizer"]),
                    "reference_fwd": mfu(fl["reference_fwd"], med["reference_fwd"]),
                    "generation": mfu(fl["generation"], med["generation"]),
                    "step": mfu(step_flops, step_s)},
            "mfu_adjacent": {"policy_fwd_bwd": mfu_adjacent(fl["policy_fwd_bwd"], "policy_fwd_bwd"),
                             "reference_fwd": mfu_adjacent(fl["reference_fwd"], "reference_fwd"),
                             "generation": mfu_adjacent(fl["generation"], "generation"),
                             "step": mfu_adjacent(step_flops, "step_s")},
            "gflop_per_step": round(step_flops / 1e9, 3),
            "gflop_per_s": round(step_flops / step_s / 1e9, 2),
            "trunk_positions": fl["trunk_positions"], "output_layer_positions": fl["output_layer_positions"],
            "policy_params": titan.count_parameters(self.policy.model),
            "trainable_params": sum(p.numel() for p in self.policy.model.parameters() if p.requires_grad),
            "lora_rank": ctx.cfg.model.lora.rank,
            "ref_params_resident": ref_params,
            "ref_param_mb": round(ref_params * 4 / 2**20, 2),
            "peak_rss_timed_mb": round(peak_rss_timed, 1) if peak_rss_timed is not None else None,
            "rss_end_mb": round(C.rss_mb(), 1),
            "build_s": round(self.build_s, 2),
            **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.meta.items()},
            "world_size": ctx.dist.world_size,
        }
        return out

    def close(self) -> None:
        self.clock.remove()


def fused_adamw(model, t):
    """What-if (``--what-if-fused-adamw``): ``refexp.components.optim.build_optimizer`` with torch's fused AdamW kernel,
    which exists on CPU since torch 2.4 (refexp uses foreach there). Same containers, hyper-parameters and
    schedule; numerically equal up to float rounding."""
    from refexp.titan.optim_checkpoint import LRSchedulersContainer, OptimizersContainer, ParamGroupConfig

    kwargs = {"lr": t.lr, "weight_decay": t.weight_decay, "betas": (t.beta1, t.beta2), "eps": t.eps}
    cfg = OptimizersContainer.Config(param_groups=[ParamGroupConfig(pattern=".*", optimizer_name=t.optimizer,
                                                                    optimizer_kwargs=kwargs)], implementation="fused")
    optimizers = OptimizersContainer(cfg, model_parts=[model])
    total = max(int(t.steps), int(t.warmup_steps), 1)
    sched = LRSchedulersContainer.Config(warmup_steps=int(t.warmup_steps), total_steps=total, decay_ratio=0.0)
    return optimizers, sched.build(optimizers=optimizers, training_steps=total)


def run_one(args, algo: str, reference: str, precompute: bool) -> dict | None:
    import torch

    C.set_threads(args.threads)
    peak_before = C.matmul_peak(sizes=args.peak_sizes, seconds=args.peak_seconds)
    bench = Bench(args, algo, reference, precompute)
    rows, prof = [], None
    for step in range(1, args.warmup + args.steps + 1):
        if step == args.warmup + 1:
            import gc

            gc.collect()
            C.malloc_trim()  # what was freed during set-up and warm-up leaves the RSS (see _common.malloc_trim)
            C.reset_peak_rss()
            if args.profile:
                prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                prof.__enter__()
        rows.append(bench.step(step))
    if prof is not None:
        prof.__exit__(None, None, None)
        Path(args.profile).write_text(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
    peak_timed = C.peak_rss_mb()
    peak_after = C.matmul_peak(sizes=args.peak_sizes, seconds=args.peak_seconds)
    peak = max(peak_before["gflops"], peak_after["gflops"], *[r["probe_gflops"] or 0 for r in rows])
    out = bench.summary(rows[args.warmup:], peak=peak, peak_by_size=peak_after["by_size"], peak_rss_timed=peak_timed,
                        warmup=rows[:args.warmup])
    bench.close()
    ctx = bench.ctx
    if ctx.dist.world_size > 1:  # per-rank memory, gathered on rank 0 (tokens/s etc. are rank 0's)
        import torch.distributed as dist

        mine = {k: out[k] for k in ("policy_params", "ref_params_resident", "peak_rss_timed_mb", "rss_end_mb")}
        ranks = [None] * ctx.dist.world_size
        dist.all_gather_object(ranks, mine)
        out["per_rank"] = ranks
        out["parallelism"] = {"dp_shard": ctx.parallel_dims.dp_shard, "tp": ctx.parallel_dims.tp}
        if not ctx.dist.is_rank0:
            return None
    return out


# ---------------------------------------------------------------- driver
def markdown(rows: list[dict]) -> str:
    head = ("| algo | reference | precompute | steps/s | tokens/s | gen tok/s | generation | policy fwd+bwd | "
            "ref fwd | ref update | optimizer | other | ref/policy | MFU train | MFU step | peak RSS MB |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        ph = r["phases_s"]
        lines.append("| " + " | ".join(str(x) for x in [
            r["algo"], r["reference"], r["precompute_ref"], r["steps_per_s"], r["tokens_per_s"],
            r["gen_tokens_per_s"], ph["generation"], ph["policy_fwd_bwd"], ph["reference_fwd"], ph["ref_update"],
            ph["optimizer"], ph["other"], r["ref_fwd_over_policy_fwd_bwd"], r["mfu"]["policy_fwd_bwd"],
            r["mfu"]["step"], r["peak_rss_timed_mb"]]) + " |")
    return "\n".join(lines)


def forward_args(argv: list[str], config: dict) -> list[str]:
    """This script's argv for one configuration (``--algo/--reference/--precompute-ref`` replaced)."""
    out, skip = [], False
    for a in argv:
        if skip:
            if a.startswith("--"):
                skip = False
            else:
                continue
        if a in ("--algo", "--reference", "--precompute-ref", "--markdown", "--omp-wait-policy"):
            skip = a != "--markdown"  # the others take values
            continue
        out.append(a)
    return [*out, "--algo", config["algo"], "--reference", config["reference"],
            "--precompute-ref", "on" if config["precompute_ref"] else "off", "--worker"]


def main(argv=None) -> list[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    configs = configurations(args)
    if args.worker or args.in_process:
        if args.workdir is None and len(configs) > 1:
            args.workdir = tempfile.mkdtemp(prefix="refexp-bench-")
        rows = []
        for c in configs:
            row = run_one(args, c["algo"], c["reference"], c["precompute_ref"])
            if row is not None:  # None: a non-zero rank under torchrun
                print(json.dumps(row), flush=True)
                rows.append(row)
    else:
        C.apply_omp_wait_policy(args.omp_wait_policy)
        if args.workdir is None:
            args.workdir = tempfile.mkdtemp(prefix="refexp-bench-")
            argv += ["--workdir", args.workdir]
        rows = []
        for c in configs:
            for row in C.run_json_subprocess([os.path.abspath(__file__), *forward_args(argv, c)]):
                print(json.dumps(row), flush=True)
                rows.append(row)
    if args.markdown and rows:
        print(markdown(rows), file=sys.stderr)
    return rows


if __name__ == "__main__":
    main()
