"""What the bench scripts share: threads, the matmul peak, random-token data, a bench RunContext,
model FLOPs, phase clocks and memory readings.

Nothing here re-implements refexp: the data are random tokens written as text for refexp's own
tokenizer class, the model is built by ``titan.build_model`` and saved with refexp's checkpoint
helpers, and the RunContext is the one ``refexp.run`` builds (without the logger, Hydra and the run dir).
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent


# ---------------------------------------------------------------- threads and the matmul peak
def set_threads(n: int) -> None:
    """Intra-op threads; inter-op threads too (once per process, before any parallel work)."""
    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(n)
    except RuntimeError:  # already set (or parallel work already ran): leave it
        pass


def matmul_peak(sizes=(1024, 2048), seconds: float = 0.4, dtype=torch.float32, warmup: int = 2) -> dict:
    """Best float32 GEMM rate (GFLOP/s) with the current thread count: the MFU denominator.

    For each n in ``sizes``: ``warmup`` products, then repeated ``C = A @ B`` (out= preallocated) for
    about ``seconds`` (at least 3); the rate is that of the fastest single product (the least disturbed
    one on a shared machine). Returns ``{"gflops": best, "by_size": {n: gflops}}``.
    """
    by_size = {}
    for n in sizes:
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        c = torch.empty(n, n, dtype=dtype)
        for _ in range(warmup):
            torch.mm(a, b, out=c)
        best = float("inf")
        t_end = time.perf_counter() + seconds
        reps = 0
        while reps < 3 or time.perf_counter() < t_end:
            t0 = time.perf_counter()
            torch.mm(a, b, out=c)
            best = min(best, time.perf_counter() - t0)
            reps += 1
        by_size[n] = 2 * n**3 / best / 1e9
    return {"gflops": max(by_size.values()), "by_size": {str(k): round(v, 1) for k, v in by_size.items()}}


# ---------------------------------------------------------------- memory
def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def rss_mb() -> float:
    return _status_kb("VmRSS") / 1024.0


def peak_rss_mb() -> float:
    """VmHWM: the peak RSS since the process started or since the last ``reset_peak_rss``."""
    return _status_kb("VmHWM") / 1024.0


def malloc_trim() -> bool:
    """Give freed heap pages back to the OS (glibc ``malloc_trim(0)``), so that RSS shows live memory:
    a reference model that was built, used and released (the refcache's precompute) otherwise stays in
    glibc's heap as resident pages. Measurement hygiene only; False where unavailable."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.malloc_trim(0))
    except (OSError, AttributeError):
        return False


def reset_peak_rss() -> bool:
    """Restart VmHWM from the current RSS (Linux ``clear_refs`` 5); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


# ---------------------------------------------------------------- random-token data and tokenizer
def make_tokenizer(vocab: int, *, eos_outside: bool):
    """A word-level ``refexp`` TextTokenizer over ``vocab`` ids: ``<pad>``=0, ``<eos>``, then words
    ``w<i>``; no BOS (so refexp and TRL tokenize a text into the same ids).

    ``eos_outside``: EOS gets id ``vocab`` (one past what a ``vocab``-way model can emit), so sampling
    never stops early; ``vocab_size`` still reports ``vocab`` (the ids the model sees). Otherwise EOS
    is id 1 (DPO appends it to every completion, so it must be a real model id).
    """
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    from refexp.tasks.tokenizer import TextTokenizer

    if eos_outside:
        words = ["<pad>"] + [f"w{i}" for i in range(1, vocab)] + ["<eos>"]
    else:
        words = ["<pad>", "<eos>"] + [f"w{i}" for i in range(2, vocab)]
    table = {w: i for i, w in enumerate(words)}
    backend = Tokenizer(models.WordLevel(table, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens([AddedToken("<pad>", special=True), AddedToken("<eos>", special=True)])

    class BenchTokenizer(TextTokenizer):
        @property
        def vocab_size(self) -> int:
            return vocab

    return BenchTokenizer(backend, eos_id=table["<eos>"], pad_id=0, bos_id=None)


def first_word_id(eos_outside: bool) -> int:
    return 1 if eos_outside else 2


def random_texts(n: int, length: int, vocab: int, *, seed: int, eos_outside: bool) -> list[str]:
    """n texts of ``length`` random words (ids drawn uniformly from the word range)."""
    g = torch.Generator().manual_seed(seed)
    lo = first_word_id(eos_outside)
    ids = torch.randint(lo, vocab, (n, length), generator=g)
    return [" ".join(f"w{i}" for i in row) for row in ids.tolist()]


def pretrained_tokenizer(hf_dir: str, *, eos_outside: bool):
    """The checkpoint's own tokenizer (``TextTokenizer.from_dir``); ``eos_outside``: EOS (and every stop id)
    becomes id ``vocab_size``, one past what the model can emit, so sampling never stops early. No BOS:
    TRL does not add one to a plain-text prompt, so both frameworks see the same ids."""
    from refexp.tasks.tokenizer import TextTokenizer

    tok = TextTokenizer.from_dir(hf_dir)
    tok.bos_id = None
    if eos_outside:
        tok.eos_id = tok.vocab_size
        tok.stop_ids = (tok.vocab_size,)
    return tok


def word_texts(hf_dir: str, n: int, length: int, *, seed: int) -> list[str]:
    """n texts of ``length`` random words, each word one token of the checkpoint's BPE vocabulary
    (a space-led lowercase word, e.g. ``" cat"``), so every text is exactly ``length`` tokens for any
    framework that tokenizes it without special tokens (checked)."""
    import random

    backend, words = _one_token_words(hf_dir)
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        text = "".join(" " + rng.choice(words) for _ in range(length))
        if len(backend.encode(text, add_special_tokens=False).ids) == length:
            out.append(text)
    return out


@functools.cache
def _one_token_words(hf_dir: str):
    """(the checkpoint's tokenizer, its space-led lowercase words of 3-10 letters that encode to one token)."""
    import re

    from tokenizers import Tokenizer

    backend = Tokenizer.from_file(str(Path(hf_dir) / "tokenizer.json"))
    words = sorted(t[1:] for t in backend.get_vocab() if re.fullmatch(r"\u0120[a-z]{3,10}", t))
    return backend, [w for w in words if len(backend.encode(" " + w, add_special_tokens=False).ids) == 1]


def content_blind_reward(text: str, answer: str) -> float:
    """A reward that ignores what the text says but still varies between samples (a stable hash bit),
    so group advantages are not all zero."""
    import zlib

    return float(zlib.crc32(text.encode()) & 1)


# ---------------------------------------------------------------- models and checkpoints
@dataclass
class Shape:
    dim: int = 256
    layers: int = 4
    heads: int = 4
    ffn: int = 512
    vocab: int = 512
    kv_heads: int | None = None

    def model_config(self, max_seq_len: int):
        from refexp.config import ModelConfig

        return ModelConfig(name="llama3", flavor="debugmodel", dim=self.dim, n_layers=self.layers, n_heads=self.heads,
                           n_kv_heads=self.kv_heads or self.heads, ffn_hidden_dim=self.ffn, vocab_size=self.vocab,
                           max_seq_len=max_seq_len)

    def matmul_params(self) -> int:
        """Parameters that take part in matmuls (all but the token embedding)."""
        hd = self.dim // self.heads
        kv = self.kv_heads or self.heads
        attn = self.dim * self.heads * hd + 2 * self.dim * kv * hd + self.heads * hd * self.dim
        return self.layers * (attn + 3 * self.dim * self.ffn) + self.dim * self.vocab

    def forward_parts(self, seq_lens: list[int], *, lm_head_positions: int | None = None) -> dict[str, float]:
        """``forward_flops`` split into ``linear`` (the products with a weight: every linear layer of the blocks
        and the LM head) and ``attention`` (causal attention's two products, which have no weight)."""
        per_tok_no_head = 2 * (self.matmul_params() - self.dim * self.vocab)
        n = sum(seq_lens)
        attn = sum(4 * self.dim * self.layers * (t * (t + 1) / 2) for t in seq_lens)
        heads = n if lm_head_positions is None else lm_head_positions
        return {"linear": per_tok_no_head * n + 2 * self.dim * self.vocab * heads, "attention": attn}

    def forward_flops(self, seq_lens: list[int], *, lm_head_positions: int | None = None) -> float:
        """Model FLOPs of one forward over sequences of these lengths (2 per multiply-add; causal
        attention counts the keys each query actually sees). ``lm_head_positions``: how many positions
        go through the LM head (default: all)."""
        return sum(self.forward_parts(seq_lens, lm_head_positions=lm_head_positions).values())

    def decode_flops(self, batch: int, prompt_len: int, new_tokens: int) -> float:
        """Prefill (LM head at the last position only) plus ``new_tokens - 1`` cached decode steps."""
        total = self.forward_flops([prompt_len] * batch, lm_head_positions=batch)
        per_tok_no_head = 2 * (self.matmul_params() - self.dim * self.vocab)
        for t in range(1, new_tokens):
            ctx = prompt_len + t
            total += batch * (per_tok_no_head + 2 * self.dim * self.vocab + 4 * self.dim * self.layers * ctx)
        return total


OUTPUT_LAYER_POSITIONS = ("completions", "all_but_last", "all")


def grpo_step_flops(shape: Shape, *, prompts: int, group: int, prompt_len: int, new_tokens: int, shared_prompt: bool,
                    output_layer: str, adapter_params: int = 0, reference: bool = True) -> dict:
    """Model FLOPs of one GRPO step (2 per multiply-add), by phase, and the positions its training forward runs.

    Rows: ``prompts * group`` completions of ``new_tokens`` after a ``prompt_len`` prompt. ``shared_prompt``: one
    row per prompt, the prompt once and each completion after a bridge token (refexp's ``algo.share_prompt``:
    ``prompt_len + group * (new_tokens + 1) - 1`` positions), else one row per completion (``prompt_len +
    new_tokens``). ``output_layer``: where the LM head runs in the policy's and the reference's forwards:
    ``completions`` (only the positions that predict a completion token: refexp's ``select_BT``, TRL 1.16 with
    Triton), ``all_but_last`` (TRL 1.16 elsewhere: every position of ``hidden_states[:, :-1]``), ``all``.
    ``adapter_params``: LoRA's A and B parameters (0: full fine-tuning); an adapter costs 2 FLOPs per parameter per
    position in every forward of the policy (generation included), the reference (the base) runs without them.

    Training = 3 x forward for full fine-tuning. Under LoRA the backward of a frozen weight's product computes only
    its input's gradient (1 x its forward), an adapter's both gradients (2 x), attention's products (no weight) 2 x:
    2 x linear + 3 x attention + 3 x adapters. Generation: ``decode_flops`` (each row's prompt prefilled, the LM
    head at its last position, then ``new_tokens - 1`` cached steps) plus the adapters at each of those positions.
    """
    if output_layer not in OUTPUT_LAYER_POSITIONS:
        raise ValueError(f"output_layer={output_layer!r} is invalid: expected one of {OUTPUT_LAYER_POSITIONS}")
    rows = prompts * group
    n_rows, seq = (prompts, prompt_len + group * (new_tokens + 1) - 1) if shared_prompt else (rows,
                                                                                            prompt_len + new_tokens)
    trunk = n_rows * seq
    head = {"completions": rows * new_tokens, "all_but_last": n_rows * (seq - 1), "all": trunk}[output_layer]
    parts = shape.forward_parts([seq] * n_rows, lm_head_positions=head)
    adapters = 2 * adapter_params * trunk
    if adapter_params:
        train = 2 * parts["linear"] + 3 * parts["attention"] + 3 * adapters
    else:
        train = 3 * (parts["linear"] + parts["attention"])
    generation = shape.decode_flops(rows, prompt_len, new_tokens) + 2 * adapter_params * rows * (
        prompt_len + new_tokens - 1)
    ref = parts["linear"] + parts["attention"] if reference else 0.0
    return {"generation": generation, "policy_fwd_bwd": train, "reference_fwd": ref,
            "step": generation + train + ref, "trunk_positions": trunk, "output_layer_positions": head}


def add_shape_args(p) -> None:
    """The llama3 shape options every bench script takes (defaults: the TRL-comparison model, ``Shape()``)."""
    d = Shape()
    p.add_argument("--dim", type=int, default=d.dim)
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--heads", type=int, default=d.heads)
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--ffn", type=int, default=d.ffn)
    p.add_argument("--vocab", type=int, default=d.vocab)


def shape_from_args(args) -> Shape:
    return Shape(args.dim, args.layers, args.heads, args.ffn, args.vocab, getattr(args, "kv_heads", None))


def shape_from_hf(hf_dir: str) -> Shape:
    """The shape of the HF checkpoint in ``hf_dir`` (its config.json), for FLOP counts."""
    hf = json.loads((Path(hf_dir) / "config.json").read_text())
    return Shape(dim=hf["hidden_size"], layers=hf["num_hidden_layers"], heads=hf["num_attention_heads"],
                 ffn=hf["intermediate_size"], vocab=hf["vocab_size"],
                 kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"])


def save_init_checkpoint(model: torch.nn.Module, out_dir: Path) -> Path:
    """The weights as a refexp SFT-style output dir (``model/`` DCP + ``sft.json``), which
    ``refexp.components.models.build_frozen``/``build_policy`` load and ``refcache.cache_key`` stamps."""
    from refexp.titan import save_model_weights

    out_dir.mkdir(parents=True, exist_ok=True)
    if not (out_dir / "sft.json").is_file():
        save_model_weights(model, out_dir / "model")
        (out_dir / "sft.json").write_text(json.dumps({"bench": True}))
    return out_dir


# ---------------------------------------------------------------- the RunContext
def make_context(cfg, task, run_dir: Path, device: torch.device):
    """A RunContext as ``refexp.run.run_worker`` builds it (1-rank process group, or torchrun's),
    without a logger."""
    from refexp import titan
    from refexp.components.context import RunContext
    from refexp.runtime import distributed as rdist

    titan.prepare_torchtitan(device.type)
    info = rdist.init_distributed(device, backend="auto")
    pd = titan.make_parallel_dims(cfg.parallelism, info.world_size, device.type) if info.world_size > 1 else None
    return RunContext(cfg=cfg, run_dir=run_dir, cache_dir=run_dir / "cache", device=device, dist=info,
                      parallel_dims=pd, task=task, logger=None)


# ---------------------------------------------------------------- phase clock
class PhaseClock:
    """Splits the policy's training work into forward+backward and optimizer time with hooks only.

    forward+backward: from the policy's top-level forward (training mode, grad enabled) to the last
    parameter gradient accumulated; optimizer: from there to the end of ``optimizer.step`` (gradient
    clipping and the non-finite check included). Generation never calls the top-level forward (the
    KV-cache path calls the sub-modules), so it is not counted here.
    """

    def __init__(self, model: torch.nn.Module, optimizers) -> None:
        self.fwd_bwd_s = 0.0
        self.opt_s = 0.0
        self._t_fwd = None
        self._t_grad = None
        self._handles = [model.register_forward_pre_hook(self._on_forward)]
        for p in model.parameters():
            if p.requires_grad:
                self._handles.append(p.register_post_accumulate_grad_hook(self._on_grad))
        for opt in optimizers:
            self._handles.append(opt.register_step_post_hook(self._on_step))
        self._model = model

    def _on_forward(self, module, args):
        if module.training and torch.is_grad_enabled() and self._t_fwd is None:
            self._t_fwd = time.perf_counter()

    def _on_grad(self, p):
        self._t_grad = time.perf_counter()

    def _on_step(self, opt, args, kwargs):
        now = time.perf_counter()
        if self._t_fwd is not None and self._t_grad is not None:
            self.fwd_bwd_s += self._t_grad - self._t_fwd
            self.opt_s += now - self._t_grad
        self._t_fwd = self._t_grad = None

    def take(self) -> tuple[float, float]:
        out = (self.fwd_bwd_s, self.opt_s)
        self.fwd_bwd_s = self.opt_s = 0.0
        return out

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


# ---------------------------------------------------------------- statistics and subprocesses
def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def run_json_subprocess(argv: list[str], *, env: dict | None = None, timeout: float | None = None) -> list[dict]:
    """Run ``python argv...`` and return the JSON objects it printed one per line (stderr passes through)."""
    full_env = {**os.environ, **(env or {})}
    full_env.setdefault("PYTHONPATH", str(BENCH_DIR))
    p = subprocess.run([sys.executable, *argv], stdout=subprocess.PIPE, text=True, env=full_env, timeout=timeout,
                       cwd=str(REPO))
    out = []
    for line in p.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited with {p.returncode}")
    return out


def apply_omp_wait_policy(policy: str) -> None:
    """Set OMP_WAIT_POLICY for the worker subprocesses this process starts ("default": leave unset).

    On a shared, oversubscribed machine OpenMP's default spin-waiting makes every parallel region wait
    for a descheduled thread: small ops (decoding, optimizer) became 10-100x slower with 2 threads.
    PASSIVE threads sleep instead. Only child processes see it (the runtime reads it at start-up).
    """
    if policy == "default":
        os.environ.pop("OMP_WAIT_POLICY", None)
    else:
        os.environ["OMP_WAIT_POLICY"] = policy


def quiet_warnings() -> None:
    import warnings

    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
