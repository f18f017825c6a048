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

Each round runs one refexp and one TRL subprocess per workload (the order alternates between
rounds); each subprocess does ``--warmup`` untimed and ``--steps`` timed steps and reports the
median step time. The ratio of a round is refexp steps/s over TRL steps/s; the table reports the
median ratio over rounds. Steps are timed from the end of one optimizer step to the end of the next
(TRL: ``on_step_end`` callbacks; refexp: the step function + the reference strategy's update).

    OMP_WAIT_POLICY=PASSIVE python bench/compare_trl.py --rounds 5
"""

from __future__ import annotations

import argparse
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
    p.add_argument("--refexp-args", default="", help="extra bench_step.py options for the refexp side")
    p.add_argument("--omp-wait-policy", default="PASSIVE", choices=["PASSIVE", "ACTIVE", "default"],
                   help="OMP_WAIT_POLICY of every worker (default PASSIVE: see bench/README.md)")
    p.add_argument("--trl-worker", default=None, choices=list(WORKLOADS), help=argparse.SUPPRESS)
    p.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---------------------------------------------------------------- shared weights and tokenizers
def prepare(workdir: Path, args) -> None:
    """Build the model once (refexp/torchtitan, seed 0); write its DCP copy (``init/``), its HF export
    (``hf/``) and the two tokenizers; check that HF and torchtitan logits agree."""
    if (workdir / "ready.json").is_file():
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


# ---------------------------------------------------------------- the TRL side
def trl_worker(args, name: str) -> dict:
    C.set_threads(args.threads)
    C.quiet_warnings()
    import datasets
    import torch
    import transformers
    import trl
    from transformers import AutoTokenizer, LlamaForCausalLM, TrainerCallback

    workdir = Path(args.workdir)
    w = WORKLOADS[name]
    n_steps = args.warmup + args.steps
    out_dir = tempfile.mkdtemp(prefix="trl-bench-")
    common = dict(output_dir=out_dir, max_steps=n_steps, learning_rate=LR, logging_steps=10**6, save_strategy="no",
                  report_to="none", use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
                  dataloader_num_workers=0, disable_tqdm=True, seed=0, max_grad_norm=1.0)
    peak_before = C.matmul_peak()

    class Clock(TrainerCallback):
        def __init__(self):
            self.ends = []

        def on_step_end(self, a, state, control, **kw):
            self.ends.append(time.perf_counter())
            if len(self.ends) == args.warmup:
                C.reset_peak_rss()

    clock = Clock()
    model = LlamaForCausalLM.from_pretrained(str(workdir / "hf"), dtype=torch.float32)
    t_build = time.perf_counter()
    if w["algo"] == "dpo":
        tok = AutoTokenizer.from_pretrained(str(workdir / "tok-dpo"))
        n = args.pairs * n_steps
        texts = [C.random_texts(n, L, SHAPE.vocab, seed=k, eos_outside=False)
                 for k, L in enumerate((args.prompt_len, args.completion_len - 1, args.completion_len - 1))]
        ds = datasets.Dataset.from_dict({"prompt": texts[0], "chosen": [" " + t for t in texts[1]],
                                         "rejected": [" " + t for t in texts[2]]})
        if w["reference"] == "none":
            from trl.experimental.cpo import CPOConfig, CPOTrainer

            cfg = CPOConfig(**common, per_device_train_batch_size=args.pairs, loss_type="simpo", cpo_alpha=0.0,
                            beta=DPO_BETA, simpo_gamma=SIMPO_GAMMA, max_length=None)
            trainer = CPOTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok, callbacks=[clock])
        else:
            from trl import DPOConfig, DPOTrainer

            cfg = DPOConfig(**common, per_device_train_batch_size=args.pairs, loss_type=["sigmoid"], beta=DPO_BETA,
                            precompute_ref_log_probs=w["precompute"], precompute_ref_batch_size=args.pairs,
                            max_length=None)
            trainer = DPOTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok, callbacks=[clock])
        tokens_per_step = 2 * args.pairs * (args.prompt_len + args.completion_len)
    else:
        from trl import GRPOConfig, GRPOTrainer

        tok = AutoTokenizer.from_pretrained(str(workdir / "tok-grpo"))
        prompts = C.random_texts(args.prompts * n_steps, args.prompt_len, SHAPE.vocab, seed=0, eos_outside=True)
        ds = datasets.Dataset.from_dict({"prompt": prompts})

        def reward(prompts, completions, **kw):
            return [C.content_blind_reward(c, "") for c in completions]

        beta = 0.0 if w["reference"] == "none" else GRPO_BETA
        cfg = GRPOConfig(**common, per_device_train_batch_size=args.prompts * args.group,
                         num_generations=args.group, max_completion_length=args.new_tokens, temperature=1.0,
                         top_p=1.0, top_k=0, beta=beta, loss_type="grpo", scale_rewards="group",
                         shuffle_dataset=True)
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=ds, processing_class=tok,
                              callbacks=[clock])
        tokens_per_step = args.prompts * args.group * (args.prompt_len + args.new_tokens)
    build_s = time.perf_counter() - t_build
    C.set_threads(args.threads)
    trainer.train()
    peak_timed = C.peak_rss_mb()
    ends = clock.ends
    periods = [b - a for a, b in zip(ends[args.warmup - 1:], ends[args.warmup:])] if args.warmup else \
        [b - a for a, b in zip(ends, ends[1:])]
    step_s = C.median(periods)
    ref = getattr(trainer, "ref_model", None)
    return {
        "bench": "trl", "side": "trl", "workload": name, "trl": trl.__version__, "transformers": transformers.__version__,
        "threads": torch.get_num_threads(), "steps": len(periods), "step_s": round(step_s, 5),
        "steps_per_s": round(1 / step_s, 4), "tokens_per_s": round(tokens_per_step / step_s, 1),
        "step_s_all": [round(x, 4) for x in periods], "build_s": round(build_s, 2),
        "ref_params_resident": sum(p.numel() for p in ref.parameters()) if ref is not None else 0,
        "peak_rss_timed_mb": round(peak_timed, 1), "rss_end_mb": round(C.rss_mb(), 1),
        "matmul_peak_gflops": round(max(peak_before["gflops"], C.matmul_peak()["gflops"]), 1),
    }


# ---------------------------------------------------------------- the refexp side
def refexp_argv(args, name: str) -> list[str]:
    w = WORKLOADS[name]
    argv = [str(C.BENCH_DIR / "bench_step.py"), "--worker", "--algo", w["algo"], "--reference", w["reference"],
            "--precompute-ref", "on" if w["precompute"] else "off",
            "--dim", str(SHAPE.dim), "--layers", str(SHAPE.layers), "--heads", str(SHAPE.heads), "--ffn", str(SHAPE.ffn),
            "--vocab", str(SHAPE.vocab), "--threads", str(args.threads), "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--lr", str(LR), "--prompt-len", str(args.prompt_len),
            "--init-dir", str(Path(args.workdir) / "init"), "--workdir", str(Path(args.workdir) / "refexp")]
    if w["algo"] == "dpo":
        argv += ["--pairs", str(args.pairs), "--completion-len", str(args.completion_len),
                 "--beta", str(DPO_BETA)]
        if w["reference"] == "none":
            argv += ["--loss", "simpo"]
    else:
        argv += ["--prompts", str(args.prompts), "--group", str(args.group), "--new-tokens", str(args.new_tokens),
                 "--beta", str(0.0 if w["reference"] == "none" else GRPO_BETA)]
    return argv + args.refexp_args.split()


def machine() -> dict:
    import platform

    import torch

    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(default)"),
            "loadavg_start": open("/proc/loadavg").read().split()[:3]}


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.trl_worker:
        print(json.dumps(trl_worker(args, args.trl_worker)), flush=True)
        return
    if args.prepare:
        prepare(Path(args.workdir), args)
        print(json.dumps({"prepared": args.workdir}), flush=True)
        return
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="refexp-vs-trl-")
    C.apply_omp_wait_policy(args.omp_wait_policy)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    C.run_json_subprocess([__file__, "--prepare", "--workdir", str(workdir), "--prompt-len", str(args.prompt_len),
                           "--completion-len", str(args.completion_len), "--new-tokens", str(args.new_tokens)])
    info = {"bench": "compare_trl_machine", **machine(), "workdir": str(workdir), "argv": sys.argv[1:]}
    print(json.dumps(info), flush=True)
    results: dict[str, list[dict]] = {n: [] for n in args.workloads}
    worker_common = ["--workdir", str(workdir), "--threads", str(args.threads), "--steps", str(args.steps),
                     "--warmup", str(args.warmup), "--pairs", str(args.pairs), "--prompts", str(args.prompts),
                     "--group", str(args.group), "--prompt-len", str(args.prompt_len),
                     "--completion-len", str(args.completion_len), "--new-tokens", str(args.new_tokens)]
    for r in range(args.rounds):
        for name in args.workloads:
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
                   "ratio": round(ratio, 3),
                   "refexp_peak_rss_timed_mb": got["refexp"]["peak_rss_timed_mb"],
                   "trl_peak_rss_timed_mb": got["trl"]["peak_rss_timed_mb"]}
            results[name].append({**rec, "refexp": got["refexp"], "trl": got["trl"]})
            print(json.dumps(rec), flush=True)
    summary(results)


def summary(results: dict[str, list[dict]]) -> None:
    lines = ["| workload | refexp steps/s (median) | TRL steps/s (median) | ratio per round | median ratio | "
             "refexp peak RSS MB | TRL peak RSS MB |", "|---|---|---|---|---|---|---|"]
    for name, recs in results.items():
        if not recs:
            continue
        med = C.median([x["ratio"] for x in recs])
        lines.append(
            f"| {name} | {C.median([x['refexp_steps_per_s'] for x in recs]):.3f} | "
            f"{C.median([x['trl_steps_per_s'] for x in recs]):.3f} | "
            f"{', '.join(format(x['ratio'], '.2f') for x in recs)} | **{med:.2f}** | "
            f"{C.median([x['refexp_peak_rss_timed_mb'] for x in recs]):.0f} | "
            f"{C.median([x['trl_peak_rss_timed_mb'] for x in recs]):.0f} |")
        print(json.dumps({"bench": "compare_trl_summary", "workload": name, "median_ratio": round(med, 3),
                          "ratios": [x["ratio"] for x in recs],
                          "refexp_phases_s": {k: C.median([x["refexp"]["phases_s"][k] for x in recs])
                                              for k in recs[0]["refexp"]["phases_s"]},
                          "refexp_mfu_policy_fwd_bwd": C.median([x["refexp"]["mfu"]["policy_fwd_bwd"] for x in recs]),
                          "refexp_steps_per_s": C.median([x["refexp_steps_per_s"] for x in recs]),
                          "trl_steps_per_s": C.median([x["trl_steps_per_s"] for x in recs])}), flush=True)
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
