"""The ``model/``, ``parallelism/`` and ``compile/`` groups: what is built and how it is laid out."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

from refexp.choices import PRETRAINED_CHECKPOINTS

from .errors import ConfigError, check, one_of, positive_int

LORA_REFERENCE_STATE: dict[str, str] = {"fixed": "none", "none": "none", "periodic_reset": "adapter",
                                        "kl_triggered": "adapter", "ema": "delta"}
"""``reference.name`` -> what a LoRA policy carries for its reference besides its adapters (refexp/titan/lora.py):
nothing (``fixed`` is the base with the adapters off, ``none`` has no reference), a frozen reference adapter set
to the adapters at each reset, or the dense running average of the adapters' weight update (EMA)."""


@dataclass
class LoRAConfig:
    """``model.lora``: low-rank adapters on the RL stage's policy (torchtitan's ``LoRAConverter``): each target
    linear layer computes ``W x + (alpha / rank) * B A x`` with W frozen, A [rank, in] and B [out, rank] trained
    (B starts at 0, so the policy starts as the start model). The SFT stage and its cache are unaffected. How each
    reference strategy is kept exact under LoRA: docs/algorithms.md, "LoRA policies"."""

    rank: int = 0
    """Rank of every adapter; 0 = off (the whole model trains)."""
    alpha: Optional[float] = None
    """Scale numerator: the adapter's output is multiplied by alpha / rank. None = rank (a scale of 1)."""
    target_modules: Optional[list[str]] = None
    """Linear layers to adapt, by the last part of their name (torchtitan's: ``wqkv`` or ``wq``/``wk``/``wv``,
    ``wo``, ``w1``, ``w2``, ``w3``, ``lm_head``). None = every linear layer of the transformer blocks (peft's
    ``all-linear``: the output layer stays frozen)."""

    def __post_init__(self) -> None:
        check(isinstance(self.rank, int) and not isinstance(self.rank, bool) and self.rank >= 0, "model.lora.rank",
              self.rank, "an integer >= 0 (0 = no adapters)")
        if self.alpha is not None:
            check(isinstance(self.alpha, (int, float)) and self.alpha > 0, "model.lora.alpha", self.alpha,
                  "a number > 0, or null for model.lora.rank")
        if self.target_modules is not None:
            names = list(self.target_modules)
            check(bool(names) and all(isinstance(n, str) and n and "." not in n for n in names)
                  and len(set(names)) == len(names), "model.lora.target_modules", names,
                  "a non-empty list of distinct layer names (the last part of a name, e.g. [wqkv, wo]), or null")

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        """alpha / rank: what the adapter's output ``B A x`` is multiplied by."""
        return (self.alpha if self.alpha is not None else self.rank) / self.rank


@dataclass
class ModelConfig:
    """A torchtitan model: family + flavor from its registry, plus overrides applied before build.

    Every override defaults to None, which keeps the flavor's own value; option files such as
    ``model/tiny.yaml`` set them."""

    name: str = "llama3"
    """torchtitan model family (``torchtitan.models.<name>``): llama3 | qwen3."""
    flavor: str = "debugmodel"
    """Key of ``<name>_configs`` in torchtitan (debugmodel, 1B, 8B, 0.6B, ...)."""
    dim: Optional[int] = None
    """Override of the hidden size (None keeps the flavor's)."""
    n_layers: Optional[int] = None
    """Override of the number of transformer blocks."""
    n_heads: Optional[int] = None
    """Override of the number of attention heads (must divide ``dim``)."""
    n_kv_heads: Optional[int] = None
    """Override of the number of key/value heads (grouped-query attention)."""
    ffn_hidden_dim: Optional[int] = None
    """Override of the feed-forward hidden size."""
    vocab_size: Optional[int] = None
    """None takes the tokenizer's vocabulary size."""
    max_seq_len: Optional[int] = None
    """RoPE table length (None keeps the flavor's)."""
    rope_theta: Optional[float] = None
    """Override of the RoPE base (None keeps the flavor's: 500000 for llama3, 1000000 for qwen3). The
    flavor's frequency scaling is kept; it only touches wavelengths far beyond a short task's sequences."""
    hf_assets_path: Optional[str] = None
    """HF checkpoint directory (config.json, *.safetensors, tokenizer.json) to start from."""
    pretrained: Optional[str] = None
    """A checkpoint refexp fetches and converts itself when ``model.hf_assets_path`` is unset (``PretrainedCheckpoint``:
    smollm2_135m): on first use, into the cache (``sft.cache_dir``), whose dir then becomes ``model.hf_assets_path``
    (refexp/components/pretrained.py). A set ``model.hf_assets_path`` (a local copy of the converted dir) wins."""
    attn_backend: str = "sdpa"
    """sdpa on CPU (flex has no CPU backward, docs/torchtitan-notes.md §3); flex or varlen on GPUs."""
    embedding_init_std: Optional[float] = None
    """Std of the token-embedding init; None keeps torchtitan's N(0, 1) (see model/tiny.yaml for why 0.02)."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """Low-rank adapters on the RL stage's policy (``model.lora.rank=16``); off by default."""

    def __post_init__(self) -> None:
        one_of("model.name", self.name, ("llama3", "qwen3"))
        for f in ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden_dim", "vocab_size", "max_seq_len"):
            v = getattr(self, f)
            if v is not None:
                positive_int(f"model.{f}", v)
        if self.rope_theta is not None:
            check(isinstance(self.rope_theta, (int, float)) and self.rope_theta > 1, "model.rope_theta",
                  self.rope_theta, "a number > 1, or null for the flavor's")
        if self.dim is not None and self.n_heads is not None:
            check(self.dim % self.n_heads == 0, "model.dim", self.dim, f"a multiple of model.n_heads={self.n_heads}")
        one_of("model.attn_backend", self.attn_backend, ("sdpa", "flex", "varlen"))
        if self.pretrained is not None:
            one_of("model.pretrained", self.pretrained, PRETRAINED_CHECKPOINTS)


def model_identity(model: ModelConfig) -> dict:
    """What of ``model.*`` makes a model's weights and outputs: every field but ``lora``, which changes only the RL
    stage's policy. The SFT stage's cache key and the caches of what the start model computes (DPO's pairs, a
    reference's log-probs: the adapters-off reference of a LoRA run is the start model) are keyed by it, so turning
    LoRA on reuses them."""
    from dataclasses import asdict

    return {k: v for k, v in asdict(model).items() if k != "lora"}


@dataclass
class ParallelismConfig:
    """Mirrors torchtitan's ``ParallelismConfig``; the product of degrees must equal the world size."""

    data_parallel_replicate_degree: int = 1
    """Replicas of the (sharded) model: HSDP's outer dimension."""
    data_parallel_shard_degree: int = -1
    """-1 = whatever the world size leaves after the other degrees (torchtitan's convention)."""
    tensor_parallel_degree: int = 1
    """Ranks each layer's weights are split over (must divide the heads)."""
    enable_sequence_parallel: bool = True
    """With tensor parallelism, also shard the norms' activations along the sequence."""
    fsdp_reshard_after_forward: str = "default"
    """default | always | never (torchtitan's meaning)."""
    spmd_backend: str = "partial_dtensor"
    """torchtitan's default ``spmd_types`` fails with FSDP/TP (docs/torchtitan-notes.md §4)."""
    nproc_per_node: int = 1
    """Worker processes a job spawns when not already started by torchrun/SLURM (refexp's own field)."""

    def __post_init__(self) -> None:
        positive_int("parallelism.data_parallel_replicate_degree", self.data_parallel_replicate_degree)
        check(
            self.data_parallel_shard_degree == -1
            or (isinstance(self.data_parallel_shard_degree, int) and self.data_parallel_shard_degree > 0),
            "parallelism.data_parallel_shard_degree", self.data_parallel_shard_degree, "-1 or a positive integer",
        )
        positive_int("parallelism.tensor_parallel_degree", self.tensor_parallel_degree)
        positive_int("parallelism.nproc_per_node", self.nproc_per_node)
        one_of("parallelism.fsdp_reshard_after_forward", self.fsdp_reshard_after_forward,
               ("default", "always", "never"))
        one_of("parallelism.spmd_backend", self.spmd_backend, ("partial_dtensor", "full_dtensor", "spmd_types"))


@dataclass
class CompileConfig:
    """Mirrors torchtitan's ``CompileConfig``: per-block ``torch.compile`` of the model."""

    enable: bool = False
    """Compile each transformer block (the reference follows unless ``reference.compile`` says otherwise)."""
    components: list[str] = field(default_factory=lambda: ["model"])
    """What torchtitan compiles (only ``model`` is used by refexp)."""
    backend: str = "inductor"
    """``torch.compile`` backend."""


def resolve_shard_degree(parallelism: ParallelismConfig, world_size: int) -> int:
    """``data_parallel_shard_degree`` with -1 resolved for ``world_size`` ranks; ConfigError when the
    degrees do not multiply to the world size, or the SPMD backend cannot run on several ranks. Torch-free,
    so the CLI checks it before importing torch."""
    rep, shard, tp = (parallelism.data_parallel_replicate_degree, parallelism.data_parallel_shard_degree,
                      parallelism.tensor_parallel_degree)
    others = rep * tp
    if shard == -1:
        if world_size % others:
            raise ConfigError(
                f"parallelism.data_parallel_replicate_degree={rep} x parallelism.tensor_parallel_degree={tp} "
                f"= {others} is invalid: it must divide the world size {world_size}")
        shard = world_size // others
    if rep * shard * tp != world_size:
        raise ConfigError(
            f"parallelism degrees are invalid: data_parallel_replicate_degree={rep} x data_parallel_shard_degree="
            f"{shard} x tensor_parallel_degree={tp} = {rep * shard * tp}, expected the world size {world_size}")
    if world_size > 1 and parallelism.spmd_backend != "partial_dtensor":
        # spmd_types: FSDP/TP fail in torchtitan 0.3.0 (docs/torchtitan-notes.md §4). full_dtensor:
        # every module input must already be a DTensor ("Got a plain Tensor under the full_dtensor
        # mode"); refexp passes plain token tensors.
        raise ConfigError(f"parallelism.spmd_backend={parallelism.spmd_backend!r} is invalid with more than one "
                          f"rank: expected partial_dtensor")
    return shard


def check_attention_heads(*, n_heads: int | None, n_kv_heads: int | None, tensor_parallel_degree: int = 1,
                          dim: int | None = None, head_dim: int | None = None) -> None:
    """The attention shapes torchtitan would otherwise hit as an assert or a view error mid-build: n_kv_heads
    divides n_heads, head_dim is even (RoPE rotates pairs), and the tensor-parallel degree divides both head
    counts (heads are split across TP ranks). A None skips the rules that need it.

    One rule set, run twice: on the heads a config states (``check_cross_fields``), and by
    ``titan.build_model_spec`` on the resolved shapes. Those cannot be checked here: a flavor's own heads
    come from torchtitan's registry (this layer imports no torch) and a checkpoint's from its config.json
    (``model.hf_assets_path``), which a dry run plans without."""
    if n_heads is not None and n_kv_heads is not None and (n_kv_heads > n_heads or n_heads % n_kv_heads):
        raise ConfigError(f"model.n_kv_heads={n_kv_heads} is invalid: expected a divisor of n_heads={n_heads}")
    if head_dim is not None and head_dim % 2:
        raise ConfigError(f"model.dim={dim} is invalid: head_dim={head_dim} must be even for RoPE (dim / n_heads)")
    tp = tensor_parallel_degree
    for what, n in (("n_heads", n_heads), ("n_kv_heads", n_kv_heads)):
        if n is not None and n % tp:
            raise ConfigError(f"parallelism.tensor_parallel_degree={tp} is invalid: it must divide model.{what}={n} "
                              f"(attention heads are split across tensor-parallel ranks)")


def planned_world_size(parallelism: ParallelismConfig, environ=None) -> int | None:
    """The ranks of a job before it is launched: ``WORLD_SIZE`` (torchrun), else the processes refexp starts
    itself (``parallelism.nproc_per_node``); None under SLURM before refexp maps its variables."""
    env = os.environ if environ is None else environ
    if env.get("WORLD_SIZE"):
        return int(env["WORLD_SIZE"])
    if env.get("SLURM_PROCID") is not None:
        return None
    return parallelism.nproc_per_node
