"""GPU smoke benchmark: what one accelerator does with refexp, in under ten minutes, one JSON line per figure.

The first line is the environment (``"figure": "env"``: Python, torch, CUDA, device name, torchtitan and
whether refexp's torchtitan layer imports). Then one line per figure, in this order:

``matmul_bf16_tflops``
    Dense bfloat16 GEMM rate: square ``torch.mm`` products (8192² and 4096² on a GPU), a warm-up, then
    ``reps`` products between two device-synchronised clock readings; the best size. On CPU the compute
    dtype of training (float32) is measured as well, because that is what CPU training runs in.
``train_tokens_per_s``
    A Qwen3-0.6B-shaped model with random weights (``ModelConfig(name="qwen3", flavor="0.6B")``, built by
    ``refexp.titan.build_model`` exactly as a run builds its policy: float32 master weights, bfloat16
    compute on CUDA through FSDP's mixed precision), trained on random tokens: ``titan.token_logprobs``,
    a mean log-likelihood loss, backward, ``refexp.components.optim.clip_and_step`` (AdamW). Tokens per second of
    whole steps (forward + backward + optimizer) after warm-up steps.
``train_mfu``
    Model FLOPs of those steps / time / peak: 3 × (2 × matmul parameters × tokens + causal attention,
    4 × layers × heads × head_dim × T(T+1)/2 per sequence). The peak is the device's dense bf16 figure
    from ``PEAK_BF16_TFLOPS`` when its name is listed (H100/H200 989, A100 312), else the matmul rate
    measured above (``peak_source`` says which); ``mfu_vs_measured`` gives the other ratio too.
``peak_mem_mib_ac_none``, ``peak_mem_mib_ac_full``
    Memory of one training step of the same model without and with full activation checkpointing
    (``activation_checkpoint.mode``; each model and its optimizer built alone, after a warm-up step so the
    AdamW moments exist). CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``
    (``step_extra_mib``: the step's peak above what was allocated before it — activations, gradients and
    temporaries). CPU: the rise of the process's peak RSS (VmHWM, reset through /proc/self/clear_refs)
    over the step; indicative only, since the allocator reuses freed pages.
``ref_forward_ratio``
    Reference-forward cost: a frozen copy (``requires_grad=False``, as a fixed reference is built) runs
    ``token_logprobs`` under ``inference_mode`` on the training batch; the policy runs forward + backward on
    the same batch. Value: frozen forward seconds / policy forward+backward seconds (about 1/3 in FLOPs).
``gen_tokens_per_s_16``, ``gen_tokens_per_s_128``
    The rollout engine a GRPO run builds (``refexp.components.rollout.build_engine``: the KV-cache decode of
    ``refexp.components.sampler``) over the policy: 16 and 128 rows of distinct random prompts of mixed lengths
    (half of ``prompt_len`` to ``prompt_len``, left-padded by the sampler as a run's are: ``prompt_lens``),
    temperature 1, a stop check every ``stop_check_every`` tokens (a GPU run's interval, on CPU too). EOS is
    outside the model's vocabulary, so every row decodes exactly ``new_tokens`` tokens. Generated tokens per
    second of the whole call (prefill included). ``attention_kernels``: the attention operators and kernels
    ``torch.profiler`` saw in a short untimed generation of the same prompts after the timed one (on CUDA: which
    SDPA backend the padded prompts got, e.g. flash or memory-efficient).
``gen_tokens_per_s_16_static``, ``gen_tokens_per_s_128_static``
    The same generations with ``static_decode=True`` (``rollout.static_decode``: fixed-shape decode steps,
    captured as CUDA graphs by ``torch.compile(mode="reduce-overhead")`` on CUDA, eager on CPU). A first
    generation of the same shape compiles and records the graphs (``warmup_s``; ``capture_s``: what it took
    beyond the second); the value is the second's. ``compiles_first`` / ``compiles_timed``: graphs compiled
    during each (``compiles_timed`` > 0: the same shape compiled again), ``compiles_in_process``: all so far;
    ``graphs_{recorded,rerecorded,skipped}_{first,timed}``: CUDA graphs cudagraph trees recorded, recorded again
    and declined during each (the value measures replay only when the timed generation recorded 0 and skipped
    0). Then one training step and a third generation, as in a run: ``after_step_weights_moved`` (whether the
    addresses of the weights the step reads changed), ``after_step_tokens_per_s``, ``after_step_over_timed``
    (its seconds over the timed generation's), ``after_step_compiles`` and ``graphs_*_after_step``.
``grpo_e2e_3steps``
    The real CLI (``python -m refexp``) on the embedded arithmetic task in a temporary run dir: a short SFT
    stage, then 3 GRPO steps with a fixed reference (``model=qwen3_debug`` on a GPU, the tests' tiny model at
    ``--toy``). Value: the run's wall seconds; ``status.json``'s final perf and memory metrics come along.

Every figure is caught on its own: a failure prints ``{"figure": ..., "value": null, "error": ...}`` and the
script goes on (the target machine may have an older torch than refexp's pin). A wall-clock budget
(``--budget-s``, default 540) is kept: a figure that would start after it prints ``"skipped"``, and a
watchdog ends the process ``HARD_STOP_GRACE_S`` after the budget if a figure hangs. The last line is
``"figure": "summary"``. ``--toy`` shrinks everything so that it runs on CPU in seconds
(tests/test_bench_smoke.py runs it that way).

    python bench/gpu/gpu_smoke.py                     # on the GPU machine (see bench/gpu/README.md, "GPU smoke")
    python bench/gpu/gpu_smoke.py --toy --device cpu  # the same figures at toy size
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import inspect
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

GPU_DIR = Path(__file__).resolve().parent
BENCH_DIR = GPU_DIR.parent
REPO = BENCH_DIR.parent
# A checkout used without `pip install -e .` (the GPU machine): refexp, bench/_common and gpu_adapters import from here.
for _p in (str(REPO), str(BENCH_DIR), str(GPU_DIR)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import _common as C  # noqa: E402  (stdlib + torch only; safe on an older torch)
import torch  # noqa: E402
from gpu_adapters import (  # noqa: E402
    compile_count,
    counts_since,
    cudagraph_counts,
    install_cudagraph_counter,
    install_step_weight_recorder,
    step_weight_addresses,
)

FIGURES = (
    "matmul_bf16_tflops",
    "train_tokens_per_s",
    "train_mfu",
    "peak_mem_mib_ac_none",
    "peak_mem_mib_ac_full",
    "ref_forward_ratio",
    "gen_tokens_per_s_16",
    "gen_tokens_per_s_128",
    "gen_tokens_per_s_16_static",
    "gen_tokens_per_s_128_static",
    "grpo_e2e_3steps",
)

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s from the vendors' data sheets; the first key found
# in the device name wins, so the more specific names come first.
PEAK_BF16_TFLOPS = (
    ("H100 PCIe", 756.0),
    ("H100", 989.0),
    ("H200", 989.0),
    ("H800", 989.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
)

HARD_STOP_GRACE_S = 30.0

# Import names of what refexp needs beyond torch (the in-process figures and the end-to-end run's CLI), so
# the environment line says what a machine with an older image still lacks (bench/gpu/README.md, "GPU smoke").
DEPENDENCIES = ("torchtitan", "spmd_types", "tyro", "docstring_parser", "hydra", "omegaconf", "antlr4", "datasets",
                "pyarrow", "pandas", "xxhash", "tokenizers", "transformers", "huggingface_hub", "safetensors",
                "jinja2", "rich", "tqdm", "yaml", "numpy")
GEN_ROWS = (16, 128)
ATTENTION_NAME = re.compile(r"attention|attn|fmha|flash|sdpa", re.IGNORECASE)


@dataclass
class Sizes:
    """Model overrides (None keeps the Qwen3-0.6B flavor's value) and workload sizes."""

    dim: Optional[int]
    n_layers: Optional[int]
    n_heads: Optional[int]
    n_kv_heads: Optional[int]
    ffn_hidden_dim: Optional[int]
    vocab: int
    batch: int
    seq_len: int
    warmup: int
    steps: int
    prompt_len: int
    new_tokens: int
    matmul_sizes: tuple
    matmul_reps: int
    e2e_min_s: float  # time that must be left to start the end-to-end run


# Qwen3-0.6B as torchtitan's flavor has it (dim 1024, 28 layers, 16 heads of 128, 8 KV heads, FFN 3072,
# vocabulary 151936, tied embeddings); 4 x 2048 tokens a step.
FULL = Sizes(dim=None, n_layers=None, n_heads=None, n_kv_heads=None, ffn_hidden_dim=None, vocab=151936,
             batch=4, seq_len=2048, warmup=2, steps=5, prompt_len=128, new_tokens=128,
             matmul_sizes=(8192, 4096), matmul_reps=20, e2e_min_s=60.0)
TOY = Sizes(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden_dim=128, vocab=256,
            batch=4, seq_len=64, warmup=1, steps=2, prompt_len=8, new_tokens=8,
            matmul_sizes=(256,), matmul_reps=5, e2e_min_s=10.0)

# The end-to-end run's config: the embedded arithmetic task, a short SFT stage (it is required before RL
# without a pretrained checkpoint), 3 GRPO steps, no checkpoints, no W&B.
E2E_COMMON = [
    "algo=grpo", "reference=fixed", "training.steps=3", "checkpoint=disabled",
    "logger=none", "logger.progress=false", "sft.target_accuracy=1.0",
]
E2E_TOY = [  # tests/helpers/configs.py's TINY_RUN_OVERRIDES, shrunk further
    "model=tiny", "model.dim=32", "model.ffn_hidden_dim=64", "model.n_heads=2", "model.n_kv_heads=2",
    "sft.steps=4", "sft.eval_every=4", "sft.batch_size=8", "task.num_train=200", "task.num_eval=16",
    "eval.num_prompts=8", "eval.kl_prompts=4", "eval.every=3", "algo.prompts_per_step=2", "algo.group_size=2",
]
E2E_GPU = [
    "model=qwen3_debug", "sft.steps=20", "sft.eval_every=20", "sft.batch_size=32", "task.num_train=2000",
    "task.num_eval=64", "eval.num_prompts=32", "eval.kl_prompts=16", "eval.every=3",
    "algo.prompts_per_step=8", "algo.group_size=8", "training.lr=1e-5",
]


# ---------------------------------------------------------------- output
_print_lock = threading.Lock()


def _finite_or_none(x):
    """JSON has no NaN/inf: non-finite floats become null (the line then carries an error)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite_or_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite_or_none(v) for v in x]
    return x


def emit(obj: dict) -> None:
    with _print_lock:
        print(json.dumps(_finite_or_none(obj), default=str), flush=True)


def _round(x, nd=4):
    return None if x is None else float(f"{x:.{nd}g}")


# ---------------------------------------------------------------- clocks and memory
def now(device: torch.device) -> float:
    """refexp's device-synchronised clock; its two lines again when refexp does not import."""
    try:
        from refexp.components.timing import now as refexp_now
    except Exception:  # noqa: BLE001 - any import failure: fall back to the same logic
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()
    return refexp_now(device)


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- environment
def _torchtitan_version() -> tuple[Optional[str], Optional[str]]:
    """(version, error): the installed distribution's version, else the imported module's."""
    try:
        from importlib.metadata import version

        return version("torchtitan"), None
    except Exception:  # noqa: BLE001 - carried as source, not installed: ask the module
        pass
    try:
        import torchtitan

        return getattr(torchtitan, "__version__", "unknown (source at %s)" % Path(torchtitan.__file__).parent), None
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"


def environment(device: torch.device, args) -> dict:
    env = {"figure": "env", "python": platform.python_version(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "device": str(device), "device_name": _device_name(device),
           "toy": args.toy, "budget_s": args.budget_s}
    if device.type == "cuda":
        try:
            props = torch.cuda.get_device_properties(device)
            env["device_memory_gib"] = round(props.total_memory / 2**30, 1)
            env["capability"] = "%d.%d" % (props.major, props.minor)
        except Exception as e:  # noqa: BLE001 - a broken driver: every figure will say so too
            env["device_error"] = f"{type(e).__name__}: {e}"
    else:
        env["threads"] = torch.get_num_threads()
    env["deps_missing"] = [m for m in DEPENDENCIES if importlib.util.find_spec(m) is None]
    # refexp.titan first: it installs what torchtitan needs to import before importing it.
    try:
        import refexp.titan  # noqa: F401

        env["refexp_titan_import"] = "ok"
    except Exception as e:  # noqa: BLE001
        env["refexp_titan_import"] = f"{type(e).__name__}: {e}"
    env["torchtitan"], err = _torchtitan_version()
    if err:
        env["torchtitan_error"] = err
    try:
        env["git"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                    text=True, timeout=10).stdout.strip() or None
    except Exception:  # noqa: BLE001 - no git on the machine: not needed
        env["git"] = None
    return env


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        try:
            return torch.cuda.get_device_name(device)
        except Exception as e:  # noqa: BLE001
            return f"unknown ({type(e).__name__}: {e})"
    return platform.processor() or platform.machine()


def table_peak_tflops(device_name: str) -> tuple[Optional[float], Optional[str]]:
    for key, tflops in PEAK_BF16_TFLOPS:
        if key in device_name:
            return tflops, key
    return None, None


# ---------------------------------------------------------------- model arithmetic
def matmul_params(model: torch.nn.Module) -> int:
    """Weights that take part in matmuls: every nn.Linear (the LM head included, the embedding lookup not).
    Under FSDP a weight is a DTensor whose numel() is the global one."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def attention_width(model: torch.nn.Module) -> int:
    """Sum over layers of heads x head_dim (torchtitan's attention modules carry both)."""
    return sum(m.n_heads * m.head_dim for m in model.modules()
               if hasattr(m, "inner_attention") and hasattr(m, "n_heads") and hasattr(m, "head_dim"))


def forward_flops(model: torch.nn.Module, batch: int, seq_len: int) -> float:
    """2 FLOPs per multiply-add; causal attention counts the keys each query sees (QK^T and AV)."""
    tokens = batch * seq_len
    return 2.0 * matmul_params(model) * tokens + 4.0 * attention_width(model) * batch * seq_len * (seq_len + 1) / 2


def matmul_tflops(device: torch.device, dtype: torch.dtype, sizes, reps: int) -> dict:
    """{size: TFLOP/s} of ``reps`` back-to-back n x n products (after a warm-up)."""
    out = {}
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        c = torch.empty(n, n, device=device, dtype=dtype)
        for _ in range(3):  # cuBLAS heuristics, CPU thread pool start-up
            torch.mm(a, b, out=c)
        t0 = now(device)
        for _ in range(reps):
            torch.mm(a, b, out=c)
        out[n] = 2.0 * n**3 * reps / (now(device) - t0) / 1e12
        del a, b, c
    return out


def gpu_run_stop_check_every() -> int:
    """The stop-check interval of a run on CUDA (``RolloutConfig.stop_check_interval``): the decode figures check
    for stop as a GPU run does, on CPU too, so that the toy runs the GPU's code path."""
    from refexp.config import RolloutConfig

    return RolloutConfig().stop_check_interval("cuda")


def mixed_length_prompts(rows: int, longest: int, vocab: int, *, seed: int) -> list[str]:
    """``rows`` distinct random prompts of mixed lengths, from half of ``longest`` to ``longest`` (the first row
    has ``longest``): the sampler left-pads them (``tasks.batching.encode_prompts``), so the prefill attends
    under a padding mask as a run's does."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(max(1, longest // 2), longest + 1, (rows,), generator=g).tolist()
    lens[0] = longest
    texts = C.random_texts(rows, longest, vocab, seed=seed, eos_outside=True)
    return [" ".join(t.split()[:n]) for t, n in zip(texts, lens)]


def attention_kernel_names(names) -> list[str]:
    """The distinct profiler event names that are attention operators or kernels (SDPA and its backends:
    flash, memory-efficient (``fmha``), cuDNN, math), sorted."""
    return sorted({n for n in names if ATTENTION_NAME.search(n)})


# ---------------------------------------------------------------- the benchmark
class Bench:
    """The figures, sharing one device, one batch of tokens and (lazily) one policy."""

    def __init__(self, args, device: torch.device):
        self.args = args
        self.device = device
        self.sizes = TOY if args.toy else FULL
        self.matmul: dict = {}  # dtype name -> best TFLOP/s, from matmul_bf16_tflops
        self.train: Optional[dict] = None  # what train_mfu needs from train_tokens_per_s
        self._policy = None
        self._tokens = None
        self._tokenizer = None
        self._gen_warm = False

    # ---- pieces
    def model_cfg(self):
        from refexp.config import ModelConfig

        s = self.sizes
        return ModelConfig(name="qwen3", flavor="0.6B", dim=s.dim, n_layers=s.n_layers, n_heads=s.n_heads,
                           n_kv_heads=s.n_kv_heads, ffn_hidden_dim=s.ffn_hidden_dim, vocab_size=s.vocab,
                           max_seq_len=max(s.seq_len, s.prompt_len + s.new_tokens))

    def training_cfg(self):
        """refexp's default: bfloat16 compute on CUDA (FSDP mixed precision on a 1-rank mesh), float32 on CPU."""
        from refexp.config import TrainingConfig

        return TrainingConfig(mixed_precision_param=self.args.mixed_precision)

    def compute_dtype(self) -> str:
        return self.training_cfg().compute_dtype(self.device.type)

    def build(self, *, trainable: bool, ac_mode: str = "none"):
        """``titan.build_model`` as a run calls it; ``ac_cfg`` only where this refexp has the keyword."""
        from refexp import titan

        kwargs = {}
        if ac_mode != "none":
            if "ac_cfg" not in inspect.signature(titan.build_model).parameters:
                raise RuntimeError("this refexp's titan.build_model has no ac_cfg keyword (activation checkpointing)")
            from refexp.config import ActivationCheckpointConfig

            kwargs["ac_cfg"] = ActivationCheckpointConfig(mode=ac_mode)
        return titan.build_model(self.model_cfg(), vocab_size=self.sizes.vocab, device=self.device, seed=0,
                                 training_cfg=self.training_cfg(), requires_grad=trainable, **kwargs)

    def build_trainable(self, ac_mode: str = "none"):
        """(model, optimizers, schedulers) after ``warmup`` steps (AdamW moments allocated, kernels chosen)."""
        from refexp.components.optim import build_optimizer

        model = self.build(trainable=True, ac_mode=ac_mode)
        opt, sched = build_optimizer(model, optimizer="AdamW", lr=1e-5, total_steps=1000)
        trained = (model, opt, sched)
        for i in range(self.sizes.warmup):
            self.train_step(trained, i)
        return trained

    def policy(self):
        if self._policy is None:
            self._policy = self.build_trainable()
        return self._policy

    def release_policy(self) -> None:
        self._policy = None
        free_memory(self.device)

    def tokens(self) -> torch.Tensor:
        if self._tokens is None:
            g = torch.Generator().manual_seed(0)
            s = self.sizes
            self._tokens = torch.randint(0, s.vocab, (s.batch, s.seq_len), generator=g).to(self.device)
        return self._tokens

    def tokenizer(self):
        # EOS one past the vocabulary: no row stops early, so every row decodes new_tokens tokens.
        if self._tokenizer is None:
            self._tokenizer = C.make_tokenizer(self.sizes.vocab, eos_outside=True)
        return self._tokenizer

    def train_step(self, trained, step: int) -> None:
        """The policy's part of a GRPO step: log-probs of the batch, a loss over them, backward, clip and
        AdamW. The loss is a plain mean log-likelihood: the forward/backward it drives is GRPO's, and the
        loss arithmetic itself is negligible next to it."""
        from refexp import titan
        from refexp.components.optim import clip_and_step

        model, opt, sched = trained
        loss = -titan.token_logprobs(model, self.tokens()).mean()
        loss.backward()
        clip_and_step(model, opt, sched, max_norm=1.0, loss=loss, step=step)

    def time_steps(self, trained) -> float:
        """Seconds per step, averaged over ``steps`` steps."""
        t0 = now(self.device)
        for i in range(self.sizes.steps):
            self.train_step(trained, 1000 + i)
        return (now(self.device) - t0) / self.sizes.steps

    # ---- figures
    def fig_matmul(self) -> dict:
        s = self.sizes
        by_size = matmul_tflops(self.device, torch.bfloat16, s.matmul_sizes, s.matmul_reps)
        self.matmul["bfloat16"] = max(by_size.values())
        out = {"value": _round(self.matmul["bfloat16"]), "unit": "TFLOP/s", "dtype": "bfloat16",
               "by_size": {str(k): _round(v) for k, v in by_size.items()}, "reps": s.matmul_reps}
        compute = self._compute_dtype_or_none()
        if compute and compute != "bfloat16":  # CPU trains in float32: that is its MFU denominator
            other = matmul_tflops(self.device, getattr(torch, compute), s.matmul_sizes, s.matmul_reps)
            self.matmul[compute] = max(other.values())
            out[f"{compute}_tflops"] = _round(self.matmul[compute])
        return out

    def _compute_dtype_or_none(self) -> Optional[str]:
        try:
            return self.compute_dtype()
        except Exception:  # noqa: BLE001 - refexp does not import: the other figures say why
            return None

    def fig_train(self) -> dict:
        s = self.sizes
        trained = self.policy()
        step_s = self.time_steps(trained)
        model = trained[0]
        flops = 3.0 * forward_flops(model, s.batch, s.seq_len)  # backward = 2 x forward
        self.train = {"step_s": step_s, "flops_per_step": flops}
        n_params = sum(p.numel() for p in model.parameters())
        return {"value": _round(s.batch * s.seq_len / step_s), "unit": "tokens/s", "step_s": _round(step_s),
                "batch": s.batch, "seq_len": s.seq_len, "steps": s.steps, "warmup": s.warmup,
                "params": n_params, "matmul_params": matmul_params(model), "compute_dtype": self.compute_dtype(),
                "activation_checkpoint": "none", "optimizer": "AdamW"}

    def fig_mfu(self) -> dict:
        if self.train is None:
            raise RuntimeError("needs train_tokens_per_s, which failed or was skipped")
        achieved = self.train["flops_per_step"] / self.train["step_s"] / 1e12
        name = _device_name(self.device)
        table, key = table_peak_tflops(name) if self.device.type == "cuda" else (None, None)
        measured = self.matmul.get(self.compute_dtype())
        if measured is None:  # the matmul figure failed or was skipped: measure the denominator now
            s = self.sizes
            measured = max(matmul_tflops(self.device, getattr(torch, self.compute_dtype()), s.matmul_sizes,
                                         s.matmul_reps).values())
        peak, source = (table, f"table:{key}") if table else (measured, f"measured_{self.compute_dtype()}_matmul")
        return {"value": _round(achieved / peak), "unit": "fraction", "achieved_tflops": _round(achieved),
                "peak_tflops": _round(peak), "peak_source": source,
                "mfu_vs_measured": _round(achieved / measured), "measured_matmul_tflops": _round(measured),
                "flops": "3 x (2 x matmul_params x tokens + 4 x layers x heads x head_dim x T(T+1)/2 x batch)"}

    def fig_peak_mem(self, ac_mode: str) -> dict:
        """One training step's peak, with only this model and its optimizer alive."""
        self.release_policy()
        trained = self.build_trainable(ac_mode)
        try:
            if self.device.type == "cuda":
                return self._cuda_step_peak(trained, ac_mode)
            return self._rss_step_peak(trained, ac_mode)
        finally:
            del trained
            free_memory(self.device)

    def _cuda_step_peak(self, trained, ac_mode: str) -> dict:
        torch.cuda.synchronize(self.device)
        before = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        t0 = now(self.device)
        self.train_step(trained, 2000)
        step_s = now(self.device) - t0
        peak = torch.cuda.max_memory_allocated(self.device)
        return {"value": round(peak / 2**20, 1), "unit": "MiB", "measure": "cuda_max_memory_allocated",
                "activation_checkpoint": ac_mode, "allocated_before_mib": round(before / 2**20, 1),
                "step_extra_mib": round((peak - before) / 2**20, 1),
                "max_reserved_mib": round(torch.cuda.max_memory_reserved(self.device) / 2**20, 1),
                "step_s": _round(step_s), "batch": self.sizes.batch, "seq_len": self.sizes.seq_len}

    def _rss_step_peak(self, trained, ac_mode: str) -> dict:
        C.malloc_trim()  # freed pages back to the OS, so the step's rise shows
        if not C.reset_peak_rss():
            raise RuntimeError("not measurable: /proc/self/clear_refs is not writable (no peak-RSS reset)")
        before = C.rss_mb()
        self.train_step(trained, 2000)
        peak = C.peak_rss_mb()
        return {"value": round(peak - before, 1), "unit": "MiB", "measure": "rss_hwm_delta",
                "activation_checkpoint": ac_mode, "rss_before_mib": round(before, 1), "peak_rss_mib": round(peak, 1),
                "batch": self.sizes.batch, "seq_len": self.sizes.seq_len}

    def fig_ref_ratio(self) -> dict:
        from refexp import titan

        model, frozen = self.policy()[0], None
        try:
            frozen = self.build(trainable=False)  # same seed: the policy's initial weights, as a fixed reference
            tokens, reps = self.tokens(), self.sizes.steps

            def policy_fwd_bwd():
                (-titan.token_logprobs(model, tokens).mean()).backward()

            def ref_fwd():
                with torch.inference_mode():  # how refexp/reference/strategies.py runs a frozen reference
                    titan.token_logprobs(frozen, tokens)

            ref_fwd()  # warm-up of the frozen copy's kernels
            policy_s, ref_s = self._time(policy_fwd_bwd, reps), self._time(ref_fwd, reps)
        finally:
            for p in model.parameters():  # the gradients of the timing passes must not reach an update
                p.grad = None
            frozen = None  # released before the next figure
            free_memory(self.device)
        return {"value": _round(ref_s / policy_s), "unit": "ratio", "ref_fwd_s": _round(ref_s),
                "policy_fwd_bwd_s": _round(policy_s), "flop_ratio": _round(1 / 3), "reps": reps}

    def _time(self, fn: Callable[[], None], reps: int) -> float:
        t0 = now(self.device)
        for _ in range(reps):
            fn()
        return (now(self.device) - t0) / reps

    def engine(self, static: bool):
        """The rollout engine a GRPO run builds (``rollout.build_engine``) over the policy: it checks for stop every
        ``gpu_run_stop_check_every()`` tokens and, with ``static``, pads its cache to a fixed capacity (the longest
        prompt + the new tokens, as ``rollout.decode_capacity`` does for a run)."""
        from refexp.components.rollout import build_engine
        from refexp.config import RolloutConfig

        s = self.sizes
        cfg = RolloutConfig(stop_check_every=gpu_run_stop_check_every(), static_decode=static)
        return build_engine(cfg, self.policy()[0], self.tokenizer(), capacity=s.prompt_len + s.new_tokens)

    def fig_gen(self, rows: int, static: bool = False) -> dict:
        s = self.sizes
        if not self._gen_warm:  # the first decode pays for kernel selection and cache allocation
            warm = C.random_texts(2, s.prompt_len, s.vocab, seed=1, eos_outside=True)
            self.engine(False).generate(warm, max_new_tokens=2, keys=[(0, 0, i, 0) for i in range(2)])
            self._gen_warm = True
        prompts = mixed_length_prompts(rows, s.prompt_len, s.vocab, seed=rows)
        keys = [(0, 1, i, 0) for i in range(rows)]
        engine = self.engine(static)
        extra = {}
        if static:  # the first generation of this shape compiles and records the graphs
            install_cudagraph_counter()
            install_step_weight_recorder()
            compiled, graphs = compile_count(), cudagraph_counts()
            t0 = now(self.device)
            engine.generate(prompts, max_new_tokens=s.new_tokens, keys=keys)
            extra["warmup_s"] = _round(now(self.device) - t0)
            extra["compiles_first"] = compile_count() - compiled
            extra.update({f"graphs_{k}_first": v for k, v in counts_since(graphs).items()})
        compiled, graphs = compile_count(), cudagraph_counts()
        t0 = now(self.device)
        rollout = engine.generate(prompts, max_new_tokens=s.new_tokens, keys=keys)
        seconds = now(self.device) - t0
        n = rollout.num_completion_tokens
        if static:  # compiling and recording: what the first generation took beyond the second
            extra["capture_s"] = _round(extra["warmup_s"] - seconds)
            # a timed generation that records (or skips) graphs measures recording, not replay
            extra.update({f"graphs_{k}_timed": v for k, v in counts_since(graphs).items()})
        extra["compiles_timed"] = compile_count() - compiled  # > 0: the timed generation recompiled
        extra.update(self._attention_kernels(engine, prompts, keys))
        extra["compiles_in_process"] = compile_count()
        if static:  # the decode module's own count per bucket, first-step and capture seconds
            from refexp.titan import static_decode_stats

            extra.update(self._gen_after_train_step(engine, prompts, keys, seconds))
            extra["static_decode_stats"] = static_decode_stats()
        lens = [len(p.split()) for p in prompts]
        return {"value": _round(n / seconds), "unit": "tokens/s", "rows": rows, "prompt_len": s.prompt_len,
                "prompt_lens": {"min": min(lens), "max": max(lens), "distinct": len(set(lens))},
                "stop_check_every": engine.stop_check_every, "new_tokens": s.new_tokens, "generated_tokens": n,
                "seconds": _round(seconds), "static_decode": static, **extra}

    def _attention_kernels(self, engine, prompts: list[str], keys: list) -> dict:
        """The attention operators and kernels that ran, from ``torch.profiler``, in a short untimed generation
        of the same prompts (one stop-check interval of new tokens: the prefill, the decode steps) after
        the timed one, so the profiler does not slow the figure: ``attention_kernels`` (sorted names; a CUDA
        graph's replay shows its kernels, not its operators) and ``profiled_compiles`` (> 0: it compiled)."""
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        compiled = compile_count()
        with profile(activities=activities) as prof:
            engine.generate(prompts, max_new_tokens=engine.stop_check_every, keys=keys)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        return {"attention_kernels": attention_kernel_names(e.key for e in prof.key_averages()),
                "profiled_compiles": compile_count() - compiled}

    def _gen_after_train_step(self, engine, prompts: list[str], keys: list, timed_s: float) -> dict:
        """A third static generation after one training step, as in a run (training moves FSDP's gathered
        weights; the static path reads a kept copy, refexp/titan/static_weights.py): whether the step's weight
        addresses moved, the graphs recorded / re-recorded / skipped, and its seconds against the timed one's."""
        addresses = step_weight_addresses()
        self.train_step(self.policy(), 3000)
        compiled, graphs = compile_count(), cudagraph_counts()
        t0 = now(self.device)
        rollout = engine.generate(prompts, max_new_tokens=self.sizes.new_tokens, keys=keys)
        seconds = now(self.device) - t0
        return {"after_step_tokens_per_s": _round(rollout.num_completion_tokens / seconds),
                "after_step_over_timed": _round(seconds / timed_s),
                "after_step_weights_moved": step_weight_addresses() != addresses,
                "after_step_compiles": compile_count() - compiled,
                **{f"graphs_{k}_after_step": v for k, v in counts_since(graphs).items()}}

    def fig_e2e(self, time_left: float) -> dict:
        """``python -m refexp`` in a subprocess: its own process group and memory, and a timeout."""
        self.release_policy()  # the run needs the device's memory
        work = Path(tempfile.mkdtemp(prefix="gpu_smoke_grpo_", dir=self.args.workdir))
        overrides = [*E2E_COMMON, *(E2E_TOY if self.args.toy else E2E_GPU),
                     f"training.device={self.device.type}", f"run_dir={work / 'run'}",
                     f"hydra.run.dir={work / 'hydra'}", f"sft.cache_dir={work / 'cache'}"]
        if self.device.type == "cpu" and self.args.threads:
            overrides.append(f"training.num_threads={self.args.threads}")
        if self.args.mixed_precision != "auto":
            overrides.append(f"training.mixed_precision_param={self.args.mixed_precision}")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        log = work / "run.log"
        t0 = time.monotonic()
        try:
            with open(log, "w") as f:
                p = subprocess.run([sys.executable, "-m", "refexp", *overrides], cwd=REPO, env=env, stdout=f,
                                   stderr=subprocess.STDOUT, timeout=max(1.0, time_left))
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"timed out after {time_left:.0f} s (the budget's remainder); log: {log}") from None
        wall = time.monotonic() - t0
        from refexp.record.status import read_status

        status = read_status(work / "run") or {}  # none: the run died before writing it
        if p.returncode != 0 or status.get("status") != "completed":
            tail = [x for x in log.read_text(errors="replace").strip().splitlines()
                    if x.strip() and "HYDRA_FULL_ERROR" not in x][-5:]
            raise RuntimeError(f"exit {p.returncode}, status {status.get('status')!r}: {status.get('error')}; "
                               f"log {log}: {' | '.join(tail)}")
        final = status.get("final", {})
        out = {"value": _round(wall), "unit": "s", "steps": final.get("step"),
               "step_s": _round(final.get("perf/step_s")), "tokens_per_s": _round(final.get("perf/tokens_per_s")),
               "gen_s": _round(final.get("perf/gen_s")), "ref_fwd_s": _round(final.get("perf/ref_fwd_s")),
               "mem": {k: _round(v) for k, v in final.items() if k.startswith("mem/")},
               "reward_mean": final.get("reward/mean"), "overrides": overrides}
        if self.args.keep_run_dir:
            out["run_dir"] = str(work)
        else:
            shutil.rmtree(work, ignore_errors=True)
        return out


# ---------------------------------------------------------------- running figures under the budget
class Runner:
    """Runs figures in order, one JSON line each, within the budget; a watchdog covers hung figures."""

    def __init__(self, budget_s: float, device: torch.device, only: Optional[set] = None,
                 figures: tuple = FIGURES):
        self.t0 = time.monotonic()
        self.deadline = self.t0 + budget_s
        self.device = device
        self.only = only
        self.counts = {"ok": 0, "error": 0, "skipped": 0}
        self.current: Optional[str] = None
        self.pending = list(figures)  # a probe of bench/gpu/gpu_check.py runs its own figures
        self.watchdog = threading.Timer(max(0.0, budget_s) + HARD_STOP_GRACE_S, self._hard_stop)
        self.watchdog.daemon = True
        self.watchdog.start()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, fn: Callable[[], dict], min_left_s: float = 0.0) -> None:
        self.pending.remove(name)
        if self.only is not None and name not in self.only:
            return
        if self.left() <= min_left_s:
            self.counts["skipped"] += 1
            why = f"out of time: {max(0.0, self.left()):.0f} s of the budget left"
            if min_left_s:
                why += f", needs > {min_left_s:.0f} s"
            emit({"figure": name, "value": None, "skipped": why})
            return
        self.current = name
        t0 = time.monotonic()
        try:
            line = {"figure": name, **fn()}
        except Exception as e:  # noqa: BLE001 - one figure's failure must not end the others
            traceback.print_exc(file=sys.stderr)
            line = {"figure": name, "value": None, "error": f"{type(e).__name__}: {e}"[:1000]}
        if line.get("error") is None:
            value = line.get("value")
            if not (isinstance(value, (int, float)) and math.isfinite(value)):
                line.update(value=None, error=f"no finite value ({value!r})")
        else:
            # Outside the except block, once its traceback (and the tensors its frames hold) is gone:
            # after an OOM the next figure should not inherit the cached blocks.
            free_memory(self.device)
        self.counts["error" if line.get("error") else "ok"] += 1
        line["figure_s"] = round(time.monotonic() - t0, 2)
        self.current = None
        emit(line)

    def summary(self) -> None:
        self.watchdog.cancel()  # main() may run inside another process (a test): never _exit it later
        emit({"figure": "summary", "elapsed_s": round(time.monotonic() - self.t0, 1), **self.counts})

    def _hard_stop(self) -> None:
        """A figure still running long after the budget (a hang, a stuck collective): report and exit."""
        if self.current:
            emit({"figure": self.current, "value": None,
                  "error": f"still running {HARD_STOP_GRACE_S:.0f} s after the budget: aborted"})
        for name in self.pending:
            if self.only is None or name in self.only:
                emit({"figure": name, "value": None, "skipped": "aborted with the figure before it"})
        emit({"figure": "summary", "elapsed_s": round(time.monotonic() - self.t0, 1), "aborted": True, **self.counts})
        os._exit(3)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--toy", action="store_true", help="toy sizes (runs on CPU in seconds)")
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"), help="auto = cuda when available")
    p.add_argument("--budget-s", type=float, default=540.0, help="wall-clock budget; later figures are skipped")
    p.add_argument("--mixed-precision", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="training.mixed_precision_param (auto: bfloat16 on CUDA, float32 on CPU); bfloat16 on CPU "
                        "takes the CUDA code path (FSDP mixed precision on a 1-rank gloo mesh)")
    p.add_argument("--threads", type=int, default=0, help="CPU intra-op threads (0 = torch's default)")
    p.add_argument("--only", nargs="+", choices=FIGURES, help="run only these figures (reruns)")
    p.add_argument("--workdir", default=None, help="where the end-to-end run's temporary dir goes")
    p.add_argument("--keep-run-dir", action="store_true", help="keep the end-to-end run's dir (its path is printed)")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        C.set_threads(args.threads)
    cuda = torch.cuda.is_available()
    if args.device == "cuda" and not cuda:  # still one line per figure: whoever reads them sees why
        why = "--device cuda but torch.cuda.is_available() is False"
        emit({"figure": "env", "torch": torch.__version__, "cuda": torch.version.cuda, "error": why})
        for name in FIGURES:
            emit({"figure": name, "value": None, "error": why})
        emit({"figure": "summary", "elapsed_s": 0.0, "ok": 0, "error": len(FIGURES), "skipped": 0})
        return {"ok": 0, "error": len(FIGURES), "skipped": 0}
    device = torch.device("cuda" if (args.device == "cuda" or (args.device == "auto" and cuda)) else "cpu")
    runner = Runner(args.budget_s, device, set(args.only) if args.only else None)
    try:
        emit(environment(device, args))
        b = Bench(args, device)
        runner.run("matmul_bf16_tflops", b.fig_matmul)
        runner.run("train_tokens_per_s", b.fig_train)
        runner.run("train_mfu", b.fig_mfu)
        runner.run("peak_mem_mib_ac_none", lambda: b.fig_peak_mem("none"))
        runner.run("peak_mem_mib_ac_full", lambda: b.fig_peak_mem("full"))
        runner.run("ref_forward_ratio", b.fig_ref_ratio)
        for rows in GEN_ROWS:
            runner.run(f"gen_tokens_per_s_{rows}", lambda rows=rows: b.fig_gen(rows))
        for rows in GEN_ROWS:
            runner.run(f"gen_tokens_per_s_{rows}_static", lambda rows=rows: b.fig_gen(rows, static=True))
        runner.run("grpo_e2e_3steps", lambda: b.fig_e2e(runner.left()), min_left_s=b.sizes.e2e_min_s)
    finally:
        runner.summary()
    return runner.counts


if __name__ == "__main__":
    main()
