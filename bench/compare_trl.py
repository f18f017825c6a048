"""refexp against Hugging Face TRL on the same workload, alternating in one process tree.

Workload (the same for both, float32, no gradient checkpointing, ``--threads`` intra-op threads):
a randomly initialised Llama (hidden 256, 4 layers, 4 heads, MLP 512, vocab 512) built once by
refexp (torchtitan) and exported with ``titan.export_hf``: refexp loads the same weights from its
DCP copy, TRL loads the HF export into ``LlamaForCausalLM`` (logits are checked to agree first).

  dpo_live        DPO, 8 pairs, prompt 32 tokens, chosen/rejected 32 tokens (EOS included), sigmoid, beta 0.1,
                  a live reference model                          refexp DPOStep      | TRL DPOTrainer
  dpo_precompute  the same with reference log-probs precomputed     refcache            | precompute_ref_log_probs
  dpo_simpo       reference-free SimPO (beta 0.1, gamma 0.5)        loss_type=simpo     | CPOTrainer(loss_type=simpo)
  grpo_ref        GRPO, 8 prompts x 4 completions, prompt 32 tokens, 32 new tokens (EOS outside the sampled
                  ids, so no early stop), beta 0.04, a fixed reference      GRPOStep    | GRPOTrainer
  grpo_noref      the same with beta 0 and no reference model

``--mode lora --lora-rank 16`` compares GRPO with LoRA adapters on every linear layer: refexp LoRA, refexp full
fine-tuning, TRL + peft LoRA and refexp LoRA without a reference, each in its own process (bench/lora_comparison.py).

``--model smollm2_135m`` replaces the random Llama with SmolLM2-135M-Instruct (refexp's ``model=smollm2_135m``,
converted into ``$REFEXP_CACHE`` on first use; TRL loads the same weights), and the random words with words of its
BPE vocabulary (one token each), so both tokenizers give every text exactly its length in tokens.

Each round runs one refexp and one TRL subprocess per workload (the order alternates between
rounds); each subprocess does ``--warmup`` untimed and ``--steps`` timed steps and reports the
median step time. The ratio of a round is refexp steps/s over TRL steps/s; the table reports the
median ratio over rounds. Steps are timed from the end of one optimizer step to the end of the next
(TRL: ``on_step_end`` callbacks; refexp: the step function + the reference strategy's update).

    OMP_WAIT_POLICY=PASSIVE python bench/compare_trl.py --rounds 5
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

WORKLOADS = {
    "dpo_live": {"algo": "dpo", "reference": "fixed", "precompute": False},
    "dpo_precompute": {"algo": "dpo", "reference": "fixed", "precompute": True},
    "dpo_simpo": {"algo": "dpo", "reference": "none", "precompute": False},
    "grpo_ref": {"algo": "grpo", "reference": "fixed", "precompute": False},
    "grpo_noref": {"algo": "grpo", "reference": "none", "precompute": False},
}
SHAPE = C.Shape(dim=256, layers=4, heads=4, ffn=512, vocab=512)
DPO_BETA, SIMPO_GAMMA, GRPO_BETA = 0.1, 0.5, 0.04
LR = 1e-5


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--pairs", type=int, default=8)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--completion-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--workdir", default=None)
    p.add_argument("--model", default="random", choices=["random", "smollm2_135m"],
                   help="random: the small random Llama above; smollm2_135m: SmolLM2-135M-Instruct (refexp's "
                        "model=smollm2_135m, fetched and converted into $REFEXP_CACHE on first use), prompts and "
                        "completions of its own vocabulary's words")
    p.add_argument("--lora-rank", type=int, default=0,
                   help="GRPO workloads with LoRA adapters of this rank on every linear layer of the blocks: refexp's "
                        "model.lora (one adapter on the fused q/k/v projection) against TRL + peft's LoraConfig "
                        "(target_modules='all-linear', no dropout: q, k and v each adapted); needs peft; "
                        "--mode lora: the rank of the LoRA sides")
    p.add_argument("--lora-alpha", type=float, default=None,
                   help="both sides' LoRA alpha (the adapters' scale is alpha / rank); default: the rank")
    p.add_argument("--refexp-args", default="",
                   help="extra bench_step.py options for the refexp side, e.g. --refexp-args=--compile")
    p.add_argument("--omp-wait-policy", default="PASSIVE", choices=["PASSIVE", "ACTIVE", "default"],
                   help="OMP_WAIT_POLICY of every worker (default PASSIVE: see bench/README.md)")
    p.add_argument("--trl-worker", default=None, choices=list(WORKLOADS), help=argparse.SUPPRESS)
    p.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--pair-worker", default=None, choices=list(WORKLOADS), help=argparse.SUPPRESS)
    p.add_argument("--mode", default="interleave", choices=["interleave", "processes", "lora"],
                   help="interleave: both in one subprocess, one step each in turn (ratios); processes: each "
                        "framework in its own subprocess, alternating (also peak RSS); lora: GRPO (grpo_ref) as refexp "
                        "LoRA, refexp full fine-tuning, TRL + peft LoRA and refexp LoRA with reference=none, each in "
                        "its own process, taking turns (needs --lora-rank; bench/lora_comparison.py)")
    return p.parse_args(argv)


# ---------------------------------------------------------------- shared weights and tokenizers
@functools.cache
def pretrained_dir(model: str) -> str:
    """``--model smollm2_135m``'s converted HF dir, as ``model=smollm2_135m`` resolves it (fetched once), verified
    once per process (the check reads every byte of the weights)."""
    from refexp.components.pretrained import ensure_pretrained

    cache = os.environ.get("REFEXP_CACHE") or os.path.expanduser("~/.cache/refexp")
    return str(ensure_pretrained(model, cache))


def prepare_pretrained(workdir: Path, args) -> None:
    """TRL's copy of the pretrained checkpoint: ``hf/`` links its weights, with a config whose EOS is one past
    the vocabulary (TRL stops generation at the model's generation EOS too, and no completion should stop
    early); ``tok-grpo`` is its tokenizer with that EOS added, ``tok-dpo`` the tokenizer as it is (DPO only
    appends EOS). Checks that HF's and torchtitan's logits agree."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from refexp import titan
    from refexp.config import ModelConfig

    src = Path(pretrained_dir(args.model))
    hf_dir = workdir / "hf"
    hf_dir.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name not in ("config.json", "generation_config.json") and not (hf_dir / f.name).exists():
            (hf_dir / f.name).symlink_to(f)
    hf_cfg = json.loads((src / "config.json").read_text())
    vocab = hf_cfg["vocab_size"]
    special = {"eos_token_id": vocab, "pad_token_id": hf_cfg["pad_token_id"]}
    (hf_dir / "config.json").write_text(json.dumps({**hf_cfg, **special}, indent=2))
    (hf_dir / "generation_config.json").write_text(json.dumps(special, indent=2))
    tok = AutoTokenizer.from_pretrained(str(src))
    tok.save_pretrained(str(workdir / "tok-dpo"))
    tok.add_special_tokens({"eos_token": "<|bench_eos|>"})
    if tok.eos_token_id != vocab:
        raise RuntimeError(f"the added EOS got id {tok.eos_token_id}, not {vocab}")
    tok.save_pretrained(str(workdir / "tok-grpo"))

    model_cfg = ModelConfig(name="llama3", hf_assets_path=str(src), max_seq_len=256)
    model = titan.build_model(model_cfg, vocab_size=None, device="cpu", seed=0, requires_grad=False,
                              weights_loaded_next=True)
    titan.load_weights(model, model_cfg, str(src))
    hf = LlamaForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    x = torch.randint(0, vocab, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (hf(x).logits - titan.logits(model, x)).abs().max().item()
    if diff > 1e-3:
        raise RuntimeError(f"HF and torchtitan logits differ by {diff}: the comparison would not be the same model")
    (workdir / "ready.json").write_text(json.dumps({"max_logit_diff": diff, "hf_dir": str(src)}))


def prepare(workdir: Path, args) -> None:
    """Build the model once (refexp/torchtitan, seed 0); write its DCP copy (``init/``), its HF export
    (``hf/``) and the two tokenizers; check that HF and torchtitan logits agree."""
    if (workdir / "ready.json").is_file():
        return
    if args.model != "random":
        prepare_pretrained(workdir, args)
        return
    import torch

    from refexp import titan

    C.quiet_warnings()
    seq = max(args.prompt_len + args.completion_len, args.prompt_len + args.new_tokens) + 1
    model_cfg = SHAPE.model_config(max_seq_len=max(128, seq))
    model = titan.build_model(model_cfg, vocab_size=None, device="cpu", seed=0, requires_grad=False)
    C.save_init_checkpoint(model, workdir / "init")
    titan.export_hf(model, model_cfg, str(workdir / "hf"))
    for name, outside in (("tok-dpo", False), ("tok-grpo", True)):
        C.make_tokenizer(SHAPE.vocab, eos_outside=outside).save(str(workdir / name))
    # transformers' LlamaConfig defaults (bos 1, eos 2) would make HF generate stop at id 2, which the
    # model can sample: name the tokenizers' ids instead. EOS = vocab (GRPO's, never sampled); DPO's
    # EOS is only appended to data, which generation settings do not touch.
    special = {"bos_token_id": None, "eos_token_id": SHAPE.vocab, "pad_token_id": 0}
    hf_cfg = json.loads((workdir / "hf" / "config.json").read_text())
    (workdir / "hf" / "config.json").write_text(json.dumps({**hf_cfg, **special}, indent=2))
    (workdir / "hf" / "generation_config.json").write_text(json.dumps(special, indent=2))

    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(str(workdir / "hf"), dtype=torch.float32).eval()
    x = torch.randint(0, SHAPE.vocab, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (hf(x).logits - titan.logits(model, x)).abs().max().item()
    if diff > 1e-4:
        raise RuntimeError(f"HF and torchtitan logits differ by {diff}: the comparison would not be the same model")
    (workdir / "ready.json").write_text(json.dumps({"max_logit_diff": diff}))


def bench_texts(args, n: int, length: int, *, seed: int, eos_outside: bool) -> list[str]:
    """The texts both frameworks train on (bench_step.py's ``texts`` with the same seeds)."""
    if args.model != "random":
        return C.word_texts(pretrained_dir(args.model), n, length, seed=seed)
    return C.random_texts(n, length, SHAPE.vocab, seed=seed, eos_outside=eos_outside)


# ---------------------------------------------------------------- the TRL side
def build_trl(args, name: str, callbacks: list):
    """TRL's trainer for workload ``name`` on the shared weights and data: (trainer, tokens per step)."""
    import datasets
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    workdir = Path(args.workdir)
    w = WORKLOADS[name]
    n_steps = args.warmup + args.steps
    common = dict(output_dir=tempfile.mkdtemp(prefix="trl-bench-"), max_steps=n_steps, learning_rate=LR,
                  logging_steps=10**6, save_strategy="no", report_to="none", use_cpu=True, bf16=False, fp16=False,
                  gradient_checkpointing=False, dataloader_num_workers=0, disable_tqdm=True, seed=0, max_grad_norm=1.0)
    model = LlamaForCausalLM.from_pretrained(str(workdir / "hf"), dtype=torch.float32)
    if w["algo"] == "dpo":
        tok = AutoTokenizer.from_pretrained(str(workdir / "tok-dpo"))
        n = args.pairs * n_steps
        texts = [bench_texts(args, n, L, seed=k, eos_outside=False)
                 for k, L in enumerate((args.prompt_len, args.completion_len - 1, args.completion_len - 1))]
        # the word-level tokenizer splits on spaces; BPE words carry their own leading space
        sep = "" if args.model != "random" else " "
        ds = datasets.Dataset.from_dict({"prompt": texts[0], "chosen": [sep + t for t in texts[1]],
                                         "rejected": [sep + t for t in texts[2]]})
        if w["reference"] == "none":
            from trl.experimental.cpo import CPOConfig, CPOTrainer

            cfg = CPOConfig(**common, per_device_train_batch_size=args.pairs, loss_type="simpo", cpo_alpha=0.0,
                            beta=DPO_BETA, simpo_gamma=SIMPO_GAMMA, max_length=None)
            trainer = CPOTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok, callbacks=callbacks)
        else:
            from trl import DPOConfig, DPOTrainer

            cfg = DPOConfig(**common, per_device_train_batch_size=args.pairs, loss_type=["sigmoid"], beta=DPO_BETA,
                            precompute_ref_log_probs=w["precompute"], precompute_ref_batch_size=args.pairs,
                            max_length=None)
            trainer = DPOTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok, callbacks=callbacks)
        tokens_per_step = 2 * args.pairs * (args.prompt_len + args.completion_len)
    else:
        from trl import GRPOConfig, GRPOTrainer

        tok = AutoTokenizer.from_pretrained(str(workdir / "tok-grpo"))
        prompts = bench_texts(args, args.prompts * n_steps, args.prompt_len, seed=0, eos_outside=True)
        ds = datasets.Dataset.from_dict({"prompt": prompts})

        def reward(prompts, completions, **kw):
            return [C.content_blind_reward(c, "") for c in completions]

        beta = 0.0 if w["reference"] == "none" else GRPO_BETA
        cfg = GRPOConfig(**common, per_device_train_batch_size=args.prompts * args.group,
                         num_generations=args.group, max_completion_length=args.new_tokens, temperature=1.0,
                         top_p=1.0, top_k=0, beta=beta, loss_type="grpo", scale_rewards="group",
                         shuffle_dataset=True)
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=ds, processing_class=tok,
                              callbacks=callbacks, peft_config=peft_config(args))
        tokens_per_step = args.prompts * args.group * (args.prompt_len + args.new_tokens)
    C.set_threads(args.threads)  # whatever the trainer's set-up did
    return trainer, tokens_per_step


def peft_config(args):
    """peft's LoraConfig matching refexp's ``model.lora`` at ``--lora-rank`` (None without it)."""
    if not args.lora_rank:
        return None
    from peft import LoraConfig

    alpha = args.lora_alpha if args.lora_alpha is not None else args.lora_rank
    return LoraConfig(r=args.lora_rank, lora_alpha=alpha, lora_dropout=0.0, bias="none",
                      target_modules="all-linear", task_type="CAUSAL_LM")


def trl_grpo_flops(args, trainer, step_s: float) -> dict:
    """Executed model FLOPs of TRL's GRPO step (``C.grpo_step_flops``) and the positions of its training forward:
    one row per completion, the output layer where TRL 1.16 runs it. Its fused output layer (``add_fused_lm_head``)
    projects only the completion positions where ``trl.kernels.chunked_logprob._use_triton(device)`` holds (Triton
    installed and the device CUDA or XPU), else every position of ``hidden_states[:, :-1]``. Also the FLOPs with the
    output layer at completion positions only (what the Triton path would run)."""
    from trl.kernels.chunked_logprob import _use_triton

    output_layer = "completions" if _use_triton(trainer.model.device) else "all_but_last"
    adapters = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad) if args.lora_rank else 0
    common = dict(prompts=args.prompts, group=args.group, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                  shared_prompt=False, adapter_params=adapters, reference=trainer.beta != 0.0)
    shape = C.shape_from_hf(str(Path(args.workdir) / "hf"))
    fl = C.grpo_step_flops(shape, output_layer=output_layer, **common)
    at_completions = C.grpo_step_flops(shape, output_layer="completions", **common)
    return {"output_layer": output_layer, "trunk_positions": fl["trunk_positions"],
            "output_layer_positions": fl["output_layer_positions"], "gflop_per_step": round(fl["step"] / 1e9, 3),
            "gflop_per_s": round(fl["step"] / step_s / 1e9, 2),
            "gflop_per_step_output_layer_at_completions": round(at_completions["step"] / 1e9, 3)}


def trl_worker(args, name: str) -> dict:
    """TRL alone in this process (the ``processes`` mode): median step time and peak RSS."""
    C.set_threads(args.threads)
    C.quiet_warnings()
    import torch
    import transformers
    import trl
    from transformers import TrainerCallback

    peak_before = C.matmul_peak()

    class Clock(TrainerCallback):
        def __init__(self):
            self.ends = []

        def on_step_end(self, a, state, control, **kw):
            self.ends.append(time.perf_counter())
            if len(self.ends) == args.warmup:
                import gc

                gc.collect()
                C.malloc_trim()
                C.reset_peak_rss()

    clock = Clock()
    t_build = time.perf_counter()
    trainer, tokens_per_step = build_trl(args, name, [clock])
    build_s = time.perf_counter() - t_build
    trainer.train()
    peak_timed = C.peak_rss_mb()
    ends = clock.ends
    periods = [b - a for a, b in zip(ends[max(args.warmup, 1) - 1:], ends[max(args.warmup, 1):])]
    step_s = C.median(periods)
    ref = getattr(trainer, "ref_model", None)
    peak = max(peak_before["gflops"], C.matmul_peak()["gflops"])
    flops = trl_grpo_flops(args, trainer, step_s) if WORKLOADS[name]["algo"] == "grpo" else {}
    return {
        "bench": "trl", "side": "trl", "workload": name, "trl": trl.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(), "steps": len(periods), "step_s": round(step_s, 5),
        "steps_per_s": round(1 / step_s, 4), "tokens_per_s": round(tokens_per_step / step_s, 1),
        "step_s_all": [round(x, 4) for x in periods], "build_s": round(build_s, 2),
        "ref_params_resident": sum(p.numel() for p in ref.parameters()) if ref is not None else 0,
        "peak_rss_timed_mb": round(peak_timed, 1), "rss_end_mb": round(C.rss_mb(), 1),
        "matmul_peak_gflops": round(peak, 1), "lora_rank": args.lora_rank,
        "trainable_params": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad), **flops,
        "mfu_step": round(flops["gflop_per_s"] / peak, 4) if flops else None,
    }


def pair_worker(args, name: str) -> dict:
    """refexp and TRL in this process, one step each in turn (the ``interleave`` mode).

    TRL's ``trainer.train()`` drives; at each of its ``on_step_end`` callbacks one refexp step runs.
    TRL's step i is timed from the end of refexp's step i-1 to its own end, refexp's step i around
    itself, so the two steps of a pair meet the same machine load; the pair's ratio is
    TRL time / refexp time (= refexp steps/s over TRL's).
    """
    C.set_threads(args.threads)
    C.quiet_warnings()
    import bench_step
    import torch
    import trl
    from transformers import TrainerCallback

    bench = bench_step.Bench(bench_step.parse_args(refexp_argv(args, name)[1:]), WORKLOADS[name]["algo"],
                             WORKLOADS[name]["reference"], WORKLOADS[name]["precompute"])

    class Interleave(TrainerCallback):
        def __init__(self):
            self.trl, self.refexp, self.t_resume = [], [], None

        def on_step_begin(self, a, state, control, **kw):
            if self.t_resume is None:
                self.t_resume = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            self.trl.append(time.perf_counter() - self.t_resume)
            self.refexp.append(bench.step(len(self.refexp) + 1))
            self.t_resume = time.perf_counter()

    cb = Interleave()
    trainer, tokens_per_step = build_trl(args, name, [cb])
    peak_before = C.matmul_peak(sizes=bench.args.peak_sizes, seconds=0.2)
    trainer.train()
    peak = max(peak_before["gflops"], C.matmul_peak(sizes=bench.args.peak_sizes, seconds=0.2)["gflops"],
               *[r["probe_gflops"] or 0 for r in cb.refexp])
    hf_gen = hf_generate_rate(args, trainer) if WORKLOADS[name]["algo"] == "grpo" else None
    trl_s, ref_rows = cb.trl[args.warmup:], cb.refexp[args.warmup:]
    ratios = [t / r["step_s"] for t, r in zip(trl_s, ref_rows)]
    summary = bench.summary(ref_rows, peak=peak, peak_by_size=peak_before["by_size"], peak_rss_timed=None,
                            warmup=cb.refexp[:args.warmup])
    return {
        "bench": "compare_trl_interleaved", "workload": name, "trl": trl.__version__,
        "threads": torch.get_num_threads(), "steps": len(ratios),
        "trl_step_s": round(C.median(trl_s), 5), "refexp_step_s": summary["step_s"],
        "trl_steps_per_s": round(1 / C.median(trl_s), 4), "refexp_steps_per_s": summary["steps_per_s"],
        "pair_ratios": [round(x, 3) for x in ratios], "median_ratio": round(C.median(ratios), 3),
        "trl_step_s_all": [round(x, 4) for x in trl_s],
        "trl_warmup_step_s": [round(x, 3) for x in cb.trl[:args.warmup]],
        "refexp": summary,
        "trl_tokens_per_s": round(tokens_per_step / C.median(trl_s), 1),
        "hf_generate_tokens_per_s": hf_gen,
    }


def hf_generate_rate(args, trainer) -> float:
    """Tokens/s of transformers' own ``generate`` (what TRL's GRPO samples with) on one step's rows: the
    step's prompts, each ``--group`` times, ``--new-tokens`` sampled tokens (EOS outside the vocabulary, so
    none stops early); the faster of two calls, right after the timed steps."""
    import torch

    tok = trainer.processing_class
    prompts = bench_texts(args, args.prompts, args.prompt_len, seed=0, eos_outside=True)
    ids = tok([p for p in prompts for _ in range(args.group)], return_tensors="pt", add_special_tokens=False)
    model = trainer.model.eval()
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**ids, do_sample=True, max_new_tokens=args.new_tokens, top_k=0, top_p=1.0,
                                 temperature=1.0, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        best = min(best, time.perf_counter() - t0)
    new = (out.shape[1] - ids["input_ids"].shape[1]) * out.shape[0]
    return round(new / best, 1)


# ---------------------------------------------------------------- the refexp side
def refexp_argv(args, name: str, *, lora: bool = True) -> list[str]:
    """bench_step.py's worker argv for workload ``name`` (``lora``: with ``--lora-rank`` when it is set)."""
    w = WORKLOADS[name]
    if args.model == "random":
        model = ["--dim", str(SHAPE.dim), "--layers", str(SHAPE.layers), "--heads", str(SHAPE.heads),
                 "--ffn", str(SHAPE.ffn), "--vocab", str(SHAPE.vocab), "--init-dir", str(Path(args.workdir) / "init")]
    else:
        model = ["--hf-dir", pretrained_dir(args.model)]
    argv = [str(C.BENCH_DIR / "bench_step.py"), "--worker", "--algo", w["algo"], "--reference", w["reference"],
            "--precompute-ref", "on" if w["precompute"] else "off", *model,
            "--threads", str(args.threads), "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--lr", str(LR), "--prompt-len", str(args.prompt_len),
            "--workdir", str(Path(args.workdir) / "refexp")]
    if w["algo"] == "dpo":
        argv += ["--pairs", str(args.pairs), "--completion-len", str(args.completion_len),
                 "--beta", str(DPO_BETA)]
        if w["reference"] == "none":
            argv += ["--loss", "simpo"]
    else:
        argv += ["--prompts", str(args.prompts), "--group", str(args.group), "--new-tokens", str(args.new_tokens),
                 "--beta", str(0.0 if w["reference"] == "none" else GRPO_BETA)]
        if args.lora_rank and lora:
            argv += ["--lora-rank", str(args.lora_rank)]
            if args.lora_alpha is not None:
                argv += ["--lora-alpha", str(args.lora_alpha)]
    return argv + args.refexp_args.split()


def machine() -> dict:
    import platform

    import torch

    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                 "?")
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(default)"),
            "loadavg_start": open("/proc/loadavg").read().split()[:3]}


def lora_side_argv(args, worker_common: list[str], side: str) -> list[str]:
    """The command of one ``--mode lora`` side (bench/lora_comparison.py's ``SIDES``)."""
    if side == "trl_lora":
        return [__file__, "--trl-worker", "grpo_ref", *worker_common]
    return refexp_argv(args, "grpo_noref" if side == "refexp_lora_noref" else "grpo_ref", lora=side != "refexp_full")


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.trl_worker:
        print(json.dumps(trl_worker(args, args.trl_worker)), flush=True)
        return
    if args.pair_worker:
        print(json.dumps(pair_worker(args, args.pair_worker)), flush=True)
        return
    if args.prepare:
        prepare(Path(args.workdir), args)
        print(json.dumps({"prepared": args.workdir}), flush=True)
        return
    if args.mode == "lora" and args.lora_rank <= 0:
        raise SystemExit("--mode lora needs --lora-rank (the adapters' rank, e.g. 16)")
    if args.mode == "lora":
        args.workloads = ["grpo_ref"]
    if args.lora_rank and any(WORKLOADS[n]["algo"] != "grpo" for n in args.workloads):
        raise SystemExit("--lora-rank is for the GRPO workloads (refexp's model.lora trains GRPO's policy): "
                         "pass --workloads grpo_ref grpo_noref")
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="refexp-vs-trl-")
    C.apply_omp_wait_policy(args.omp_wait_policy)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    C.run_json_subprocess([__file__, "--prepare", "--workdir", str(workdir), "--model", args.model,
                           "--prompt-len", str(args.prompt_len),
                           "--completion-len", str(args.completion_len), "--new-tokens", str(args.new_tokens)])
    import trl

    info = {"bench": "compare_trl_machine", **machine(), "trl": trl.__version__, "mode": args.mode,
            "workdir": str(workdir), "argv": sys.argv[1:]}
    print(json.dumps(info), flush=True)
    worker_common = ["--workdir", str(workdir), "--model", args.model, "--threads", str(args.threads),
                     "--steps", str(args.steps),
                     "--warmup", str(args.warmup), "--pairs", str(args.pairs), "--prompts", str(args.prompts),
                     "--group", str(args.group), "--prompt-len", str(args.prompt_len),
                     "--completion-len", str(args.completion_len), "--new-tokens", str(args.new_tokens),
                     "--lora-rank", str(args.lora_rank), f"--refexp-args={args.refexp_args}"]
    if args.lora_alpha is not None:
        worker_common += ["--lora-alpha", str(args.lora_alpha)]
    if args.mode == "lora":
        import lora_comparison

        records = lora_comparison.run(args.rounds, lambda side: C.run_json_subprocess(
            lora_side_argv(args, worker_common, side))[-1])
        lora_comparison.summary(records)
        return
    results: dict[str, list[dict]] = {n: [] for n in args.workloads}
    for r in range(args.rounds):
        for name in args.workloads:
            if args.mode == "interleave":
                row = C.run_json_subprocess([__file__, "--pair-worker", name, *worker_common])[-1]
                row["round"] = r
                print(json.dumps(row), flush=True)
                results[name].append({"ratios": row["pair_ratios"], "refexp_steps_per_s": row["refexp_steps_per_s"],
                                      "trl_steps_per_s": row["trl_steps_per_s"], "refexp": row["refexp"],
                                      "hf_gen": row.get("hf_generate_tokens_per_s")})
                continue
            sides = ["refexp", "trl"] if r % 2 == 0 else ["trl", "refexp"]
            got = {}
            for side in sides:
                if side == "refexp":
                    row = C.run_json_subprocess(refexp_argv(args, name))[-1]
                else:
                    row = C.run_json_subprocess([__file__, "--trl-worker", name, *worker_common])[-1]
                row.update(side=side, workload=name, round=r)
                got[side] = row
                print(json.dumps(row), flush=True)
            ratio = got["refexp"]["steps_per_s"] / got["trl"]["steps_per_s"]
            rec = {"bench": "compare_trl_pair", "workload": name, "round": r, "order": sides,
                   "refexp_steps_per_s": got["refexp"]["steps_per_s"], "trl_steps_per_s": got["trl"]["steps_per_s"],
                   "ratio": round(ratio, 3), "refexp_peak_rss_timed_mb": got["refexp"]["peak_rss_timed_mb"],
                   "trl_peak_rss_timed_mb": got["trl"]["peak_rss_timed_mb"],
                   "refexp_ref_params": got["refexp"]["ref_params_resident"],
                   "trl_ref_params": got["trl"]["ref_params_resident"]}
            print(json.dumps(rec), flush=True)
            results[name].append({"ratios": [ratio], "refexp_steps_per_s": rec["refexp_steps_per_s"],
                                  "trl_steps_per_s": rec["trl_steps_per_s"], "refexp": got["refexp"],
                                  "rss": (rec["refexp_peak_rss_timed_mb"], rec["trl_peak_rss_timed_mb"])})
    summary(results, args.mode)


def summary(results: dict[str, list[dict]], mode: str) -> None:
    per = "process pair" if mode == "processes" else "round (median of its step pairs)"
    cols = ["workload", "refexp steps/s", "TRL steps/s", f"ratio per {per}", "median ratio (all pairs)",
            "refexp phases s: gen / policy fwd+bwd / ref fwd / optimizer / other", "refexp MFU train"]
    if mode == "processes":
        cols += ["peak RSS MB refexp / TRL"]
    has_gen = any(rec.get("hf_gen") for recs in results.values() for rec in recs)
    if has_gen:
        cols += ["sampled tokens/s refexp / HF generate"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for name, recs in results.items():
        if not recs:
            continue
        pooled = [x for rec in recs for x in rec["ratios"]]
        med = C.median(pooled)
        per_round = [C.median(rec["ratios"]) for rec in recs]
        ph = {k: C.median([rec["refexp"]["phases_s"][k] for rec in recs]) for k in recs[0]["refexp"]["phases_s"]}
        mfu = C.median([rec["refexp"]["mfu"]["policy_fwd_bwd"] for rec in recs])
        row = [name, f"{C.median([x['refexp_steps_per_s'] for x in recs]):.3f}",
               f"{C.median([x['trl_steps_per_s'] for x in recs]):.3f}", ", ".join(f"{x:.2f}" for x in per_round),
               f"**{med:.2f}** (n={len(pooled)})",
               " / ".join(f"{ph[k]:.3f}" for k in ("generation", "policy_fwd_bwd", "reference_fwd", "optimizer",
                                                    "other")), f"{mfu:.2f}" if mfu else "-"]
        if mode == "processes":
            row.append(f"{C.median([x['rss'][0] for x in recs]):.0f} / {C.median([x['rss'][1] for x in recs]):.0f}")
        if has_gen:
            gens = [x["hf_gen"] for x in recs if x.get("hf_gen")]
            ours = [x["refexp"]["gen_tokens_per_s"] for x in recs if x["refexp"].get("gen_tokens_per_s")]
            row.append(f"{C.median(ours):.0f} / {C.median(gens):.0f}" if gens and ours else "-")
        lines.append("| " + " | ".join(row) + " |")
        print(json.dumps({"bench": "compare_trl_summary", "mode": mode, "workload": name, "median_ratio": round(med, 3),
                          "ratios_per_round": [round(x, 3) for x in per_round], "n_pairs": len(pooled),
                          "refexp_phases_s": ph, "refexp_mfu_policy_fwd_bwd": mfu,
                          "refexp_steps_per_s": C.median([x["refexp_steps_per_s"] for x in recs]),
                          "trl_steps_per_s": C.median([x["trl_steps_per_s"] for x in recs])}), flush=True)
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
