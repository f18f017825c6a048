"""``refexp dry_run=true ...``: the per-rank memory plan of a configured run, printed before any real work.

The models are built on the meta device (shapes only: no checkpoint, no data, no accelerator), so the plan
of an 8-GPU 8B run prints in seconds on a laptop. Shapes come from the model preset (the torchtitan flavor
with its own vocabulary, or ``config.json`` when ``model.hf_assets_path`` is given); lengths from
``task.max_prompt_len`` + the generation budget; rows from the algorithm's batch, the data-parallel degree
and ``training.micro_batch_size``. Data paths, which only a real run reads, may stay unset.

Per rank, in bytes (P = parameters, s = FSDP shard degree, t = tensor-parallel degree; sharding divides
by s * t, replication does not):
- parameters in ``training.dtype`` (the optimizer's master copy), gradients in the same dtype, AdamW's
  two moments in float32 (torchtitan's optimizer keeps them in the parameters' dtype; refexp's are fp32);
- FSDP's working copy: two transformer blocks unsharded in the compute dtype (the one computing and the
  one prefetched), when the model is FSDP-wrapped (several ranks, or a compute dtype other than fp32);
- the frozen reference (none for ``reference=none`` and for a fixed DPO reference whose log-probs are
  precomputed) and the ``kl/init`` anchor (none when it is the fixed reference itself), 0 on the device
  with ``reference.offload=true``;
- activations of one forward/backward chunk (``training.micro_batch_size`` rows) of L tokens, per token
  and layer (elements, compute dtype), counted from what autograd keeps in torchtitan's decoder block
  (RMSNorm -> q/k/v -> SDPA -> wo; RMSNorm -> SwiGLU): 7*dim + 2*kv_dim + 4*ffn without checkpointing
  (the attention matrix is not kept: flash / memory-efficient SDPA), 4*dim + 2*kv_dim + 2*ffn with
  ``selective`` per-op checkpointing (matmul outputs kept), dim per block with ``full`` plus one block's
  full set while it is recomputed; and the logits: the model's output in the compute dtype plus the
  float32 copy the log-softmax keeps and its gradient (V * (c + 8) bytes per token, vocab sharded by t);
- shared prompts (``algo.share_prompt``, ``refexp/algos/shared_prompt.py``), attended the way the run will
  (``attention_way``): the dense mask, U x S^2 booleans per chunk, or for ``titan.CausalRows`` the usual
  rows' queries, keys, values and outputs that SDPA keeps (N x T x (2*dim + 2*kv_dim) per layer whose
  activations are kept) in place of the shared rows' queries, keys and values (U x S x (dim + 2*kv_dim),
  counted among the activations above);
- the rollout's KV cache (GRPO and DPO's ``kl/*`` samples): rows x L x layers x 2 x kv_dim in the
  compute dtype;
- the peak is the resident state plus the larger of the training chunk and generation.
One checkpoint on disk: weights (``training.dtype``) + AdamW state (8 bytes/parameter) + the moving
reference's weights when ``checkpoint.save_reference`` (GRPO/DPO with one of ``MOVING_STRATEGIES``).
These are estimates (allocator fragmentation, NCCL buffers and CUDA context, ~1-3 GiB, are not counted).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from refexp.choices import MOVING_STRATEGIES
from refexp.config.task import ignored_fields

GIB = 2**30
BYTES = {"float32": 4, "bfloat16": 2}
UNSET = "<unset in a dry run>"


@dataclass
class Shapes:
    params: int
    """P: every parameter of the model."""
    block_params: int
    """Parameters of one transformer block."""
    dim: int
    kv_dim: int
    ffn: int
    n_layers: int
    vocab: int


def fill_data_paths(cfg: DictConfig) -> DictConfig:
    """A copy of ``cfg`` whose unset ``task.*_path`` values hold a placeholder: a plan reads no data, so
    the task's "where is the data" checks must not stop it (``model.hf_assets_path`` stays as given:
    unset, the preset's flavor gives the shapes)."""
    out = copy.deepcopy(cfg)
    ignored = ignored_fields(out.task.name, out.task.get("preference_path"))  # must stay unset
    for key in list(out.task.keys()):
        if key in ignored:
            continue
        if str(key).endswith("_path") and (OmegaConf.is_missing(out.task, key) or out.task[key] is None):
            out.task[key] = UNSET
    return out


def model_shapes(model_cfg, parallelism) -> Shapes:
    """Parameter counts and layer sizes of the configured model, from a meta-device build."""
    import torch

    from refexp import titan

    spec = titan.build_model_spec(model_cfg, vocab_size=None, parallelism=parallelism)
    with torch.device("meta"):
        model = spec.model.build()
    dec = titan.unwrap.decoder_of(model)
    block = next(iter(dec.layers.values()))
    attn = block.attention
    dim = dec.tok_embeddings.weight.shape[1]
    q_out = sum(p.shape[0] for n, p in attn.named_parameters() if n.split(".")[-2] in ("wq", "wqkv"))
    kv_dim = _kv_dim(attn, dim, q_out)
    ffn = next(p.shape[0] for n, p in block.named_parameters() if n.endswith("w1.weight"))
    return Shapes(params=sum(p.numel() for p in model.parameters()),
                  block_params=sum(p.numel() for p in block.parameters()), dim=dim, kv_dim=kv_dim, ffn=ffn,
                  n_layers=len(dec.layers), vocab=dec.tok_embeddings.weight.shape[0])


def _kv_dim(attn, dim: int, q_out: int) -> int:
    """Width of the keys (= values) of one block: wk's rows, or the k/v part of a fused wqkv."""
    for n, p in attn.named_parameters():
        if n.split(".")[-2] == "wk":
            return p.shape[0]
    n_kv, head_dim = getattr(attn, "n_kv_heads", None), getattr(attn, "head_dim", None)
    if n_kv and head_dim:
        return n_kv * head_dim
    return (q_out - dim) // 2 if q_out > dim else dim


def _layout(cfg) -> tuple[int, int, int, int]:
    """(world size, replicate, shard, TP degrees) of the planned job: torchrun's WORLD_SIZE when set (several
    nodes), else one node's processes."""
    from refexp.config.model import planned_world_size, resolve_shard_degree

    world = planned_world_size(cfg.parallelism) or cfg.parallelism.nproc_per_node
    if world == 1:
        return 1, 1, 1, 1
    p = cfg.parallelism
    return world, p.data_parallel_replicate_degree, resolve_shard_degree(p, world), p.tensor_parallel_degree


def _device_type(cfg) -> str:
    return "cuda" if cfg.training.device.startswith("cuda") else "cpu"


def _rows_and_length(cfg, dp: int) -> tuple[int, int, int, int]:
    """(training rows per chunk, tokens per training row, generation rows, tokens per generated row) on one rank."""
    a, task = cfg.algo, cfg.task
    completion = getattr(a, "max_new_tokens", None) or task.max_new_tokens
    prompt = task.max_prompt_len
    if a.name == "grpo":
        G = a.group_size
        rows = max(1, a.prompts_per_step * G // dp)
        chunk = min(rows, cfg.training.micro_batch_size or rows)
        if a.share_prompt:  # a prompt's G completions in one row (refexp/algos/shared_prompt.py)
            return max(1, chunk // G), prompt + G * completion + G - 1, rows, prompt + completion
        return chunk, prompt + completion, rows, prompt + completion
    if a.name == "dpo":
        pairs = max(1, a.pairs_per_step // dp)
        chunk = min(pairs, cfg.training.micro_batch_size or pairs)
        gen_rows = cfg.eval.kl_prompts  # the kl/* samples
        if a.share_prompt:
            return chunk, prompt + 2 * completion + 1, gen_rows, prompt + completion
        return 2 * chunk, prompt + completion, gen_rows, prompt + completion
    # SFT: the stage's own batch of demonstrations
    rows = max(1, cfg.sft.batch_size // dp)
    return min(rows, cfg.training.micro_batch_size or rows), prompt + completion, cfg.eval.num_prompts, \
        prompt + completion


def _shared_attention(cfg, s: Shapes, shared_rows: int, shared_len: int, compute: int, tp: int) -> tuple[float, str]:
    """Bytes and description of the shared-prompt attention's own memory for one training chunk (see the
    module docstring)."""
    a, task = cfg.algo, cfg.task
    if not getattr(a, "share_prompt", False):
        return 0, "prompts not shared"
    from refexp.algos.shared_prompt import attention_way

    per_prompt = a.group_size if a.name == "grpo" else 2  # GRPO's group, DPO's chosen and rejected
    N, T = shared_rows * per_prompt, task.max_prompt_len + (getattr(a, "max_new_tokens", None) or task.max_new_tokens)
    if attention_way(N, T, shared_rows, shared_len) == "mask":
        return shared_rows * shared_len ** 2, f"dense mask: {shared_rows} x {shared_len}^2 booleans"
    ac = cfg.activation_checkpoint
    if ac.mode == "full":
        layers = 1  # the block being recomputed
    elif ac.mode == "selective" and ac.selective_ac_option != "op":
        layers = s.n_layers - s.n_layers // int(ac.selective_ac_option) + 1
    else:
        layers = s.n_layers
    elems = N * T * (2 * s.dim + 2 * s.kv_dim) - shared_rows * shared_len * (s.dim + 2 * s.kv_dim)
    return elems * layers * compute / tp, (f"{N} usual rows x {T} tokens gathered for causal attention, "
                                           f"{layers} layer{'s' if layers > 1 else ''} kept")


def _activation_elems_per_token(s: Shapes, ac) -> tuple[int, int]:
    """(elements kept per token for all blocks, elements of one block's full set), see the module docstring."""
    full_block = 7 * s.dim + 2 * s.kv_dim + 4 * s.ffn
    if ac.mode == "full":
        return s.n_layers * s.dim, full_block
    if ac.mode == "selective" and ac.selective_ac_option == "op":
        return s.n_layers * (4 * s.dim + 2 * s.kv_dim + 2 * s.ffn), full_block
    if ac.mode == "selective":  # every N-th block fully checkpointed
        n = int(ac.selective_ac_option)
        checkpointed = s.n_layers // n
        return checkpointed * s.dim + (s.n_layers - checkpointed) * full_block, full_block
    return s.n_layers * full_block, 0


def plan(cfg) -> list[tuple[str, float, str]]:
    """The per-rank memory lines ``(what, bytes, how)`` of a validated RootConfig; the last is the peak."""
    world, rep, shard, tp = _layout(cfg)
    dp = rep * shard
    device_type = _device_type(cfg)
    s = model_shapes(cfg.model, cfg.parallelism)
    split = shard * tp
    master = BYTES[cfg.training.dtype]
    compute = BYTES[cfg.training.compute_dtype(device_type)]
    ref_cfg, a = cfg.reference, cfg.algo
    ref_bytes = BYTES[ref_cfg.dtype or cfg.training.dtype]

    lines: list[tuple[str, float, str]] = []
    lines.append(("parameters", s.params * master / split, f"{s.params / 1e9:.3f}B x {master} B / {split} ranks"))
    lines.append(("gradients", s.params * master / split, f"same as the parameters ({cfg.training.dtype})"))
    lines.append(("optimizer state", s.params * 8 / split, f"{cfg.training.optimizer}: 2 moments x 4 B / {split}"))
    fsdp_wrapped = world > 1 or compute != master
    working = 2 * s.block_params * compute / tp if fsdp_wrapped else 0
    lines.append(("FSDP unsharded blocks", working, "2 blocks in the compute dtype" if working else "not FSDP-wrapped"))
    has_ref = a.name != "sft" and ref_cfg.name != "none"
    if has_ref and a.name == "dpo" and getattr(a, "precompute_ref", False) and ref_cfg.name == "fixed":
        has_ref = False  # its log-probs are read from the precomputed table
    ref_dev = 0 if (ref_cfg.offload or not has_ref) else s.params * (ref_bytes + ref_cfg.fp32_master_bytes(cfg.training.dtype)) / split
    lines.append(("reference", ref_dev, "host memory (reference.offload)" if has_ref and ref_cfg.offload else
                  (f"frozen copy, {ref_cfg.dtype or cfg.training.dtype}" if has_ref else "none")))
    anchor_shared = ref_cfg.name == "fixed" and not ref_cfg.checkpoint and ref_cfg.dtype in (None, cfg.training.dtype)
    has_anchor = a.name != "sft" and not (anchor_shared and has_ref)
    anchor = 0 if (ref_cfg.offload or not has_anchor) else s.params * master / split
    lines.append(("kl/init anchor", anchor, "the fixed reference itself" if not has_anchor and a.name != "sft" else
                  ("host memory (reference.offload)" if ref_cfg.offload and has_anchor else
                   ("frozen copy" if has_anchor else "none"))))

    rows, length, gen_rows, gen_len = _rows_and_length(cfg, dp)
    kept, one_block = _activation_elems_per_token(s, cfg.activation_checkpoint)
    tokens = rows * length
    acts = tokens * (kept + one_block) * compute / tp
    logits = tokens * s.vocab * (compute + 8) / tp
    lines.append(("activations", acts, f"{rows} rows x {length} tokens, activation_checkpoint="
                  f"{cfg.activation_checkpoint.mode}"))
    lines.append(("logits and log-probs", logits, f"{tokens} tokens x {s.vocab} vocab"))
    shared, shared_how = _shared_attention(cfg, s, rows, length, compute, tp)
    lines.append(("shared-prompt attention", shared, shared_how))
    kv = gen_rows * gen_len * s.n_layers * 2 * s.kv_dim * compute / tp
    lines.append(("generation KV cache", kv, f"{gen_rows} rows x {gen_len} tokens"))
    resident = sum(b for _, b, _ in lines[:6])
    # --- learned rewards (task.reward_model & co.): their weights, resident beside the policy
    from refexp.tasks.reward_model import reward_models_plan_line

    reward_models = reward_models_plan_line(cfg.task, s.params)
    if reward_models is not None:
        lines.append(reward_models)
        resident += reward_models[1]
    # ---
    peak = resident + max(acts + logits + shared, kv)
    ckpt = s.params * master + s.params * 8
    if ref_cfg.name in MOVING_STRATEGIES and a.name != "sft" and getattr(cfg.checkpoint, "save_reference", True):
        ckpt += s.params * ref_bytes
    lines.append(("one checkpoint on disk (all ranks)", ckpt, "weights + AdamW state" +
                  (" + moving reference" if ckpt > s.params * (master + 8) else "")))
    lines.append(("per-rank peak estimate", peak, "resident + max(training chunk, generation)"))
    return lines


def format_plan(cfg, lines) -> str:
    world, rep, shard, tp = _layout(cfg)
    layout = f"{world} ranks: {rep} replicate x {shard} shard x {tp} TP" if world > 1 else "1 process"
    head = (f"refexp dry run: {cfg.algo.name} x reference={cfg.reference.name}, model {cfg.model.name} "
            f"{cfg.model.flavor}, {layout}, device {cfg.training.device}, compute "
            f"{cfg.training.compute_dtype(_device_type(cfg))}")
    body = [f"  {what:<36} {b / GIB:>9.2f} GiB   {how}" for what, b, how in lines[:-1]]
    return "\n".join([head, *body, f"per-rank peak estimate: {lines[-1][1] / GIB:.2f} GiB"])


def dry_run(dcfg: DictConfig) -> dict:
    """Validate what a plan needs (data paths may stay unset), print the plan, return ``{line: bytes}``."""
    from refexp.config import to_object

    cfg = to_object(fill_data_paths(dcfg))
    lines = plan(cfg)
    print(format_plan(cfg, lines))
    return {what: b for what, b, _ in lines}
