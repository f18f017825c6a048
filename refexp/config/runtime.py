"""The ``checkpoint/``, ``comm/`` and ``training/`` groups: how the RL stage runs, saves and talks."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath
from typing import Optional

from .errors import check, non_negative, one_of, positive_int


@dataclass
class CheckpointConfig:
    """Mirrors torchtitan's ``CheckpointManager.Config``."""

    enable: bool = True
    """Save (and resume from) DCP checkpoints of the run."""
    folder: str = "checkpoint"
    """Relative to the run directory, and inside it: an absolute path or one with ``..`` is refused, so that two
    runs never share a checkpoint folder (a checkpoint also records its run, and a resume refuses another's:
    docs/runs.md)."""
    interval: int = 100
    """Save every this many steps; the end of a run always saves."""
    keep_latest_k: int = 2
    """Checkpoints kept on disk (0 keeps all; at least 2, torchtitan's rule)."""
    initial_load_path: Optional[str] = None
    """Start the policy from this checkpoint instead of the SFT stage's output."""
    initial_load_in_hf: bool = False
    """``initial_load_path`` is an HF safetensors directory rather than a refexp checkpoint: read (and pinned, for a
    resume's check) as HF whatever else it holds. Needs ``initial_load_path``."""
    last_save_in_hf: bool = False
    """Also export the final policy as HF safetensors (``<folder>/hf``)."""
    load_step: int = -1
    """-1 resumes from the latest checkpoint in ``folder``."""
    async_mode: str = "disabled"
    """disabled | async | async_with_pinned_mem (torchtitan's)."""
    save_reference: bool = True
    """Put a moving reference's weights (periodic_reset, ema, kl_triggered) into every checkpoint: 4 bytes
    per parameter in fp32. false saves that disk, but a run whose reference has moved (``ref/version`` > 0)
    then cannot resume: it is refused, since the weights cannot be rebuilt exactly. A fixed reference's
    weights are never saved (they are the start checkpoint's)."""
    last_save_model_only: bool = False
    """torchtitan's: the end-of-run checkpoint holds the policy's weights only (no optimizer state, 8 bytes
    per parameter with AdamW, nor reference or counters). A rerun then resumes from the newest full
    checkpoint before it (``keep_latest_k`` >= 2 keeps one), and is refused when none is left."""
    verify: str = "checksum"
    """checksum | size: what a save's manifest (``refexp-manifest.json``, written last) records of each file
    and a resume checks before trusting a checkpoint. checksum: size and sha256, which catches bytes
    overwritten in place too; it reads every file once more at save and at resume (~0.6 s per GB on a
    2-core machine whose DCP write takes ~3.6 s per GB; files in parallel threads). size: sizes only
    (a truncation shows, a same-size overwrite does not).
    A checkpoint that fails is skipped with a warning and the newest one that passes is loaded; none
    passing, or ``load_step`` failing, is an error."""

    def __post_init__(self) -> None:
        parts = PurePath(self.folder).parts if isinstance(self.folder, str) else ()
        check(bool(parts) and not PurePath(self.folder).is_absolute() and ".." not in parts and parts != (".",)
              and not self.folder.startswith("~"), "checkpoint.folder", self.folder,
              "a relative path inside the run dir (e.g. checkpoint): checkpoints belong to their run")
        positive_int("checkpoint.interval", self.interval)
        # torchtitan refuses 1: the newest may still be being written
        check(isinstance(self.keep_latest_k, int) and (self.keep_latest_k == 0 or self.keep_latest_k >= 2),
              "checkpoint.keep_latest_k", self.keep_latest_k, "0 (keep all) or an integer >= 2")
        one_of("checkpoint.async_mode", self.async_mode, ("disabled", "async", "async_with_pinned_mem"))
        check(isinstance(self.save_reference, bool), "checkpoint.save_reference", self.save_reference, "true or false")
        check(isinstance(self.last_save_model_only, bool), "checkpoint.last_save_model_only",
              self.last_save_model_only, "true or false")
        one_of("checkpoint.verify", self.verify, ("checksum", "size"))
        # It says how initial_load_path is read: the start from the SFT stage, sft.checkpoint or
        # model.hf_assets_path is read (and pinned, refexp/record/pins.py) as its contents say, and the reference and
        # kl/init anchor read that dir so too; forcing HF on it alone would load other weights than they read.
        check(not self.initial_load_in_hf or bool(self.initial_load_path), "checkpoint.initial_load_in_hf",
              self.initial_load_in_hf, "false without checkpoint.initial_load_path (it says that dir is an HF "
              "safetensors dir; the start from the SFT stage, sft.checkpoint or model.hf_assets_path is read as its "
              "files say)")


@dataclass
class CommConfig:
    """Mirrors torchtitan's ``CommConfig``."""

    init_timeout_seconds: int = 300
    """Timeout of the process group's set-up."""
    train_timeout_seconds: int = 100
    """Timeout of a collective during training."""
    backend: str = "auto"
    """auto = nccl on CUDA, gloo on CPU."""

    def __post_init__(self) -> None:
        positive_int("comm.init_timeout_seconds", self.init_timeout_seconds)
        positive_int("comm.train_timeout_seconds", self.train_timeout_seconds)
        one_of("comm.backend", self.backend, ("auto", "nccl", "gloo"))


@dataclass
class ActivationCheckpointConfig:
    """Mirrors torchtitan's ``ActivationCheckpointConfig``: recompute activations in backward instead of
    keeping them (the policy only; frozen models keep none)."""

    mode: str = "none"
    """none | selective | full (torchtitan's names)."""
    selective_ac_option: str = "op"
    """With mode=selective: ``op`` (per-op policy: keep matmul outputs, recompute the rest) or an
    integer N as a string (checkpoint every N-th block)."""

    def __post_init__(self) -> None:
        one_of("activation_checkpoint.mode", self.mode, ("none", "selective", "full"))
        check(self.selective_ac_option == "op" or (self.selective_ac_option.isdigit()
                                                    and int(self.selective_ac_option) > 0),
              "activation_checkpoint.selective_ac_option", self.selective_ac_option,
              "'op' or a positive integer (checkpoint every N-th block)")


@dataclass
class TrainingConfig:
    """Optimisation of the RL stage (the SFT stage has its own ``sft`` block). Mirrors torchtitan's
    ``TrainingConfig`` names (``steps``, ``max_norm``, ``dtype``, ``mixed_precision_*``)."""

    steps: int = 200
    """Optimizer steps of the RL stage."""
    seed: int = 0
    """Seeds sampling and batch order (the seed a sweep's groups average over)."""
    lr: float = 1e-4
    """Peak learning rate."""
    optimizer: str = "AdamW"
    """AdamW | Adam (the optimizers torchtitan 0.3.0's OptimizersContainer builds)."""
    beta1: float = 0.9
    """Adam's first-moment decay."""
    beta2: float = 0.95
    """Adam's second-moment decay."""
    eps: float = 1e-8
    """Adam's denominator epsilon."""
    weight_decay: float = 0.0
    """Decoupled weight decay."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up steps."""
    max_norm: float = 1.0
    """Gradient-norm clip (torchtitan's name)."""
    dtype: str = "float32"
    """Storage dtype of the policy's parameters (the optimizer's master copy; and of the reference unless
    ``reference.dtype`` says otherwise)."""
    mixed_precision_param: str = "auto"
    """dtype the forward and backward compute in (FSDP2's MixedPrecisionPolicy, at every world size):
    auto = bfloat16 on CUDA, float32 on CPU (bf16 there is much slower, docs/torchtitan-notes.md §6)."""
    mixed_precision_reduce: str = "float32"
    """dtype of FSDP's gradient reduction."""
    micro_batch_size: Optional[int] = None
    """Rows per forward/backward chunk of a step, gradients accumulated over the chunks (GRPO: completions,
    a multiple of ``algo.group_size`` when prompts are shared; DPO: pairs). None = the whole step at once."""
    num_threads: int = 0
    """torch intra-op threads per process (0 = torch's default)."""
    deterministic: bool = False
    """torch's deterministic algorithms (``torch.use_deterministic_algorithms(True)``, cuDNN's deterministic
    kernels, ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` unless set): on CUDA a rerun on the same GPU model, software
    and world size repeats the numbers, and an operation with no deterministic implementation stops the run
    with an error naming it. Costs speed on GPU; on CPU runs repeat without it (docs/gpus.md)."""
    device: str = "auto"
    """auto = cuda when available, else cpu; cuda = the GPU of this process's local rank; cuda:N = GPU N."""

    def compute_dtype(self, device_type: str) -> str:
        """``mixed_precision_param`` with ``auto`` resolved for ``device_type`` (cuda -> bfloat16)."""
        if self.mixed_precision_param != "auto":
            return self.mixed_precision_param
        return "bfloat16" if device_type == "cuda" else "float32"

    def __post_init__(self) -> None:
        check(isinstance(self.steps, int) and not isinstance(self.steps, bool) and self.steps >= 0,
              "training.steps", self.steps, "an integer >= 0")
        check(isinstance(self.seed, int), "training.seed", self.seed, "an integer")
        check(isinstance(self.lr, (int, float)) and self.lr > 0, "training.lr", self.lr, "a number > 0")
        one_of("training.optimizer", self.optimizer, ("AdamW", "Adam"))
        non_negative("training.weight_decay", self.weight_decay)
        non_negative("training.warmup_steps", self.warmup_steps)
        check(self.max_norm > 0, "training.max_norm", self.max_norm, "a number > 0")
        one_of("training.dtype", self.dtype, ("float32", "bfloat16"))
        one_of("training.mixed_precision_param", self.mixed_precision_param, ("auto", "float32", "bfloat16"))
        one_of("training.mixed_precision_reduce", self.mixed_precision_reduce, ("float32", "bfloat16"))
        if self.micro_batch_size is not None:
            positive_int("training.micro_batch_size", self.micro_batch_size)
        check(self.device in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", str(self.device)) is not None,
              "training.device", self.device, "one of auto, cpu, cuda, cuda:N (GPU N)")
        check(isinstance(self.num_threads, int) and self.num_threads >= 0, "training.num_threads",
              self.num_threads, "an integer >= 0")
        check(isinstance(self.deterministic, bool), "training.deterministic", self.deterministic, "true or false")
