"""Build a torchtitan decoder: parallel dims, weight init, TP/FSDP parallelize (FSDP2 mixed precision at
every world size), activation checkpointing, per-block compile (``build_model``). Why weights are initialised
before sharding, tied embeddings re-tied after TP, and gradients summed: docs/torchtitan-notes.md
("Departures from torchtitan's trainer", §5, §12).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
from torchtitan.config import CompileConfig as TTCompileConfig
from torchtitan.config import ParallelismConfig as TTParallelismConfig
from torchtitan.config import TrainingConfig as TTTrainingConfig
from torchtitan.distributed import ParallelDims
from torchtitan.distributed import utils as tt_dist_utils
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
from torchtitan.distributed.compile import apply_compile

from refexp.config import (
    ActivationCheckpointConfig,
    CompileConfig,
    ConfigError,
    ModelConfig,
    ParallelismConfig,
    TrainingConfig,
)
from refexp.config.model import LoRAConfig, resolve_shard_degree
from refexp.runtime import distributed as rdist
from refexp.titan.cpu_compat import prepare_torchtitan, resolve_device
from refexp.titan.lora import apply_lora, init_adapters_
from refexp.titan.spec import build_model_spec
from refexp.titan.unwrap import decoder_of


def _titan_parallelism(parallelism: ParallelismConfig) -> TTParallelismConfig:
    return TTParallelismConfig(
        data_parallel_replicate_degree=parallelism.data_parallel_replicate_degree,
        data_parallel_shard_degree=parallelism.data_parallel_shard_degree,
        tensor_parallel_degree=parallelism.tensor_parallel_degree,
        enable_sequence_parallel=parallelism.enable_sequence_parallel,
        fsdp_reshard_after_forward=parallelism.fsdp_reshard_after_forward,
        spmd_backend=parallelism.spmd_backend,
    )


def make_parallel_dims(parallelism: ParallelismConfig, world_size: int, device_type: str) -> ParallelDims:
    """torchtitan ParallelDims for ``parallelism`` on ``world_size`` ranks (the mesh is built lazily,
    on first use, and needs an initialised process group)."""
    prepare_torchtitan(device_type)
    rep, tp = parallelism.data_parallel_replicate_degree, parallelism.tensor_parallel_degree
    shard = resolve_shard_degree(parallelism, world_size)
    return ParallelDims(dp_replicate=rep, dp_shard=shard, cp=1, tp=tp, pp=1, ep=1, world_size=world_size,
                        spmd_backend=parallelism.spmd_backend)


def _init_weights_(model: nn.Module, device: torch.device, seed: int, embedding_init_std: float | None = None) -> None:
    """torchtitan's initialisers under ``seed``, without touching the caller's RNG streams.

    ``embedding_init_std`` replaces torchtitan's N(0, 1) token-embedding init (sized for pretraining
    runs). On the 2-layer embedded-task model N(0, 1) embeddings drown the attention's positional
    signal in the residual stream and SFT does not learn the task; std 0.02 (HF Llama's init) does.
    """
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        model.init_states(buffer_device=device)
        emb = getattr(decoder_of(model), "tok_embeddings", None)
        if embedding_init_std is not None and emb is not None and not decoder_of(model).enable_weight_tying:
            with torch.no_grad():
                nn.init.normal_(emb.weight, std=embedding_init_std)


def _force_sum_reduction(model: nn.Module) -> None:
    """FSDP's divide factor 1 uses PREMUL_SUM, which gloo lacks; SUM is the same math here
    (docs/torchtitan-notes.md §5)."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)


def _retie_embeddings_after_tp(model: nn.Module) -> None:
    """Keep tied embeddings tied through tensor parallelism.

    TP's ``Module.parallelize`` gives ``tok_embeddings`` and ``lm_head`` each their own DTensor copy
    of a tied weight; torchtitan's trainer re-ties in ``init_states`` *after* FSDP, but refexp
    initialises before parallelizing, so the tie is restored right after TP and before FSDP (which
    then shards one shared parameter), by wrapping this model's ``parallelize``.
    """
    dec = decoder_of(model)
    if not dec.enable_weight_tying:
        return
    tensor_parallelize = dec.parallelize

    def parallelize_and_retie(parallel_dims):
        tensor_parallelize(parallel_dims)
        dec.tok_embeddings.weight = dec.lm_head.weight

    dec.parallelize = parallelize_and_retie


def _parallelism_of(mesh: ParallelDims, parallelism: ParallelismConfig | None) -> ParallelismConfig:
    """The ParallelismConfig that goes with ``mesh`` (derived from it when not given; ConfigError when
    the degrees disagree, since the sharding declarations come from the config and the meshes from
    ``mesh``)."""
    if parallelism is None:
        return ParallelismConfig(data_parallel_replicate_degree=mesh.dp_replicate,
                                 data_parallel_shard_degree=mesh.dp_shard, tensor_parallel_degree=mesh.tp,
                                 spmd_backend=mesh.spmd_backend)
    expected = make_parallel_dims(parallelism, mesh.world_size, tt_dist_utils.device_type)
    for degree in ("dp_replicate", "dp_shard", "tp"):
        if getattr(expected, degree) != getattr(mesh, degree):
            raise ConfigError(
                f"parallelism ({degree}={getattr(expected, degree)}) is invalid for the given mesh "
                f"({degree}={getattr(mesh, degree)}): build both from the same ParallelismConfig"
            )
    return parallelism


def _reshard_frozen_after_forward(model: nn.Module) -> None:
    """FSDP keeps the last group (norm, lm_head) unsharded after forward because backward would
    all-gather it again at once; a frozen model has no backward, so that is only held memory."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_reshard_after_forward(True, recurse=False)


class EveryNthBlockAC(FullAC):
    """Full recomputation of every N-th block (``selective_ac_option=N``): torchtitan 0.3.0 dropped its
    block-level selective AC and keeps only the per-op policy, so refexp keeps the older option here."""

    @dataclass(kw_only=True, slots=True)
    class Config(FullAC.Config):
        every: int = 1

    def _wrap_block(self, module: nn.Module, *, base_fqn: str | None = None) -> nn.Module:
        # blocks N-1, 2N-1, ... (torchtitan 0.2's counter: the N-th, 2N-th, ... block)
        if (int(base_fqn.rsplit(".", 1)[-1]) + 1) % self.config.every:
            return module
        return FullAC._wrap_block(self, module, base_fqn=base_fqn)


def titan_ac_config(ac_cfg: ActivationCheckpointConfig | None):
    """torchtitan's AC config for ``activation_checkpoint`` (None: no checkpointing)."""
    if ac_cfg is None or ac_cfg.mode == "none":
        return None
    if ac_cfg.mode == "full":
        return FullAC.Config()
    if ac_cfg.selective_ac_option == "op":
        return SelectiveAC.Config()
    return EveryNthBlockAC.Config(every=int(ac_cfg.selective_ac_option))


_SINGLE_RANK_DIMS: dict[tuple[str, str], ParallelDims] = {}


def single_rank_dims(parallelism: ParallelismConfig, device: torch.device) -> ParallelDims:
    """A 1-rank ParallelDims for FSDP's mixed precision in one process; initialises a single-process
    process group (gloo on CPU, NCCL on CUDA; destroyed at exit, refexp/runtime/distributed.py) when none exists.
    One per device type and SPMD backend: its meshes are built once and shared by every model."""
    key = (device.type, parallelism.spmd_backend)
    if key not in _SINGLE_RANK_DIMS:
        rdist.init_distributed(device)
        if rdist.world_size() != 1:
            raise RuntimeError("single_rank_dims needs a 1-process group: pass the run's mesh instead")
        _SINGLE_RANK_DIMS[key] = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, world_size=1,
                                              spmd_backend=parallelism.spmd_backend)
    return _SINGLE_RANK_DIMS[key]


def _mesh_for(mesh: ParallelDims | None, parallelism: ParallelismConfig | None, compute_dtype: str,
              device: torch.device) -> tuple[ParallelDims | None, ParallelismConfig]:
    """The mesh the model is parallelized over (None: a plain module) and the parallelism that goes with
    it: ``mesh`` when it has several ranks, a 1-rank mesh for FSDP's mixed precision when the compute
    dtype is not float32, else none."""
    parallel = mesh is not None and mesh.world_size > 1
    if not parallel and compute_dtype != "float32":
        mesh = single_rank_dims(parallelism or ParallelismConfig(), device)
        parallel = True
    if not parallel:
        return None, parallelism or ParallelismConfig()
    return mesh, _parallelism_of(mesh, parallelism)


def _build_on_device(spec, model_cfg: ModelConfig, device: torch.device, *, dtype: str, seed: int,
                     requires_grad: bool, sharded_init: bool) -> nn.Module:
    """The model built on the meta device, then (unless ``sharded_init``: its shards are allocated after
    parallelizing) allocated on ``device`` and initialised under ``seed``; cast to ``dtype``, frozen
    (eval mode) without ``requires_grad``."""
    with torch.device("meta"):
        model = spec.model.build()
    if not sharded_init:
        model.to_empty(device=device)
        _init_weights_(model, device, seed, model_cfg.embedding_init_std)
    if dtype != "float32":
        for p in model.parameters():
            p.data = p.data.to(getattr(torch, dtype))
    if not requires_grad:
        model.requires_grad_(False)
        model.eval()
    return model


def _parallelize(model: nn.Module, spec, mesh: ParallelDims, parallelism: ParallelismConfig,
                 training_cfg: TrainingConfig, compute_dtype: str, tt_compile: TTCompileConfig, tt_ac,
                 *, requires_grad: bool) -> None:
    """torchtitan's ``parallelize_fn`` (TP, FSDP with mixed precision, AC, compile) with refexp's
    additions: tied embeddings re-tied after TP, SUM gradient reduction, frozen copies resharded."""
    _retie_embeddings_after_tp(model)
    spec.parallelize_fn(
        model,
        parallel_dims=mesh,
        training=TTTrainingConfig(
            mixed_precision_param=compute_dtype,
            mixed_precision_reduce=training_cfg.mixed_precision_reduce,
        ),
        parallelism=_titan_parallelism(parallelism),
        compile_config=tt_compile,
        ac_config=tt_ac,
        dump_folder="",
    )
    _force_sum_reduction(model)
    if not requires_grad and parallelism.fsdp_reshard_after_forward == "default":
        _reshard_frozen_after_forward(model)


def _checkpoint_and_compile_one_process(model: nn.Module, tt_compile: TTCompileConfig, tt_ac,
                                        spmd_backend: str) -> None:
    """A plain module's activation checkpointing, then per-block compile (``parallelize_fn``'s order)."""
    if tt_ac is not None:
        tt_ac.build(dump_folder="").apply(model)
    if tt_compile.enable and "model" in tt_compile.components:
        single = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, world_size=1,
                              spmd_backend=spmd_backend)
        apply_compile(model, compile_config=tt_compile, parallel_dims=single)


def build_model(
    model_cfg: ModelConfig,
    *,
    vocab_size: int | None,
    device: str | torch.device,
    dtype: str = "float32",
    seed: int = 0,
    mesh: ParallelDims | None = None,
    parallelism: ParallelismConfig | None = None,
    compile_cfg: CompileConfig | None = None,
    training_cfg: TrainingConfig | None = None,
    requires_grad: bool = True,
    ac_cfg: ActivationCheckpointConfig | None = None,
    weights_loaded_next: bool = False,
    lora: LoRAConfig | None = None,
    lora_reference: str = "none",
) -> nn.Module:
    """Build, initialise under ``seed``, parallelize and maybe compile a torchtitan decoder.

    Weights are initialised on the full model before parallelizing, so they are the same for every
    world size (see the module docstring). ``weights_loaded_next``: the caller loads every weight right
    after (a checkpoint), so under a mesh the model is parallelized on the meta device and each rank
    allocates only its shards (torchtitan's order: parallelize, ``to_empty``, ``init_states``; the
    initial values, which the load replaces, then depend on the world size). A rank never holds the whole
    model: an 8B model's 32 GB of fp32 weights stay off every GPU. ``mesh`` is a ParallelDims from
    ``make_parallel_dims``; with one rank (or none given) and float32 compute the model stays a plain module; a
    compute dtype (``training_cfg.compute_dtype``) other than float32 applies FSDP's mixed precision at every world
    size (a 1-rank mesh for one process, see the module docstring). ``requires_grad=False`` freezes it
    (eval mode) for reference copies. Per-block ``torch.compile`` when ``compile_cfg.enable``.
    ``ac_cfg``: activation checkpointing of a trainable model (ignored with ``requires_grad=False``).
    ``lora`` (enabled): adapters on the target layers, the rest frozen, each layer keeping ``lora_reference``'s
    part for the reference (``titan/lora.py``); the adapters are drawn from ``seed`` on full tensors, the same at
    any world size.
    """
    device = resolve_device(device) if isinstance(device, str) else device
    prepare_torchtitan(device.type)
    training_cfg = training_cfg or TrainingConfig()
    compute_dtype = training_cfg.compute_dtype(device.type)
    mesh, parallelism = _mesh_for(mesh, parallelism, compute_dtype, device)
    if model_cfg.attn_backend == "varlen" and device.type != "cuda":
        raise ConfigError("model.attn_backend='varlen' is invalid on CPU: it is CUDA-only "
                          "(expected sdpa; docs/torchtitan-notes.md §3)")
    spec = build_model_spec(model_cfg, vocab_size=vocab_size, parallelism=parallelism)
    adapted = lora is not None and lora.enabled
    if adapted:  # after the sharding declarations: the adapters' derive from the layers'
        spec.model = apply_lora(spec.model, lora, lora_reference)
    # A model-wide switch that torchtitan reads while running, not only while building
    # (docs/torchtitan-notes.md §4).
    tt_dist_utils.set_spmd_backend(parallelism.spmd_backend)
    sharded_init = mesh is not None and weights_loaded_next
    model = _build_on_device(spec, model_cfg, device, dtype=dtype, seed=seed, requires_grad=requires_grad,
                             sharded_init=sharded_init)
    compile_cfg = compile_cfg or CompileConfig()
    tt_compile = TTCompileConfig(enable=compile_cfg.enable, components=list(compile_cfg.components),
                                 backend=compile_cfg.backend)
    tt_ac = titan_ac_config(ac_cfg) if requires_grad else None  # a frozen model has no backward
    if mesh is None:
        _checkpoint_and_compile_one_process(model, tt_compile, tt_ac, parallelism.spmd_backend)
    else:
        _parallelize(model, spec, mesh, parallelism, training_cfg, compute_dtype, tt_compile, tt_ac,
                     requires_grad=requires_grad)
        if sharded_init:  # each rank allocates its shards; init_states also fills the buffers (RoPE tables)
            model.to_empty(device=device)
            _init_weights_(model, device, seed, None)
    if adapted:
        init_adapters_(model, seed)
    return model
