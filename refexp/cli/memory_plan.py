"""The per-rank memory plan of a configured run (``refexp dry_run=true``): what one device holds in each
phase of a step, and the largest of them.

Shapes come from a meta-device build of the model (``memory_shapes.py``), rows and lengths from the config
(``memory_rows.py``), activations and logits per token from ``memory_activations.py``. Four phases on top of what
every phase holds (parameters, optimizer state, the frozen reference and the kl/init anchor): the rollout's decode
loop, policy training (one forward/backward chunk), the reference forward and (RL) the drift measurement. What each
line counts and why, the formulas and what is not counted: docs/gpus.md, "What the plan counts". With
``model.lora`` the adapters, their optimizer state and the reference's part inside the policy are lines of their own
(the same section).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from refexp.choices import MOVING_STRATEGIES
from refexp.cli.memory_activations import (
    activation_elems_per_token,
    logit_bytes,
    output_positions,
    shared_attention_bytes,
)
from refexp.cli.memory_rows import Generation, drift_generation, generations, training_chunk
from refexp.cli.memory_shapes import LoRAShapes, Shapes, layout, lora_shapes, model_shapes
from refexp.config.model import LORA_REFERENCE_STATE

GIB = 2**30
BYTES = {"float32": 4, "bfloat16": 2}
PHASES = ("rollout", "policy training", "reference forward", "drift measurement")
STATIC_BUFFERS = "static-decode KV buffers"


@dataclass
class Item:
    what: str
    bytes: float
    how: str


@dataclass
class MemoryPlan:
    """Per-rank bytes: ``resident`` in every phase, ``phases[name]`` on top of it in that phase."""

    device: str
    """The device type planned for (``training.device``, ``auto`` resolved) and how it was chosen."""
    compute: str
    resident: list[Item]
    phases: dict[str, list[Item]] = field(default_factory=dict)
    checkpoint: Item | None = None

    def phase_peak(self, name: str) -> float:
        return sum(i.bytes for i in self.resident) + sum(i.bytes for i in self.phases[name])

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phase_peak)

    @property
    def peak(self) -> float:
        return self.phase_peak(self.peak_phase)


def planned_device(cfg) -> tuple[str, str]:
    """(device type, how it was chosen): ``auto`` resolves as the run would on this machine."""
    import torch

    device = cfg.training.device
    if device.startswith("cuda"):
        return "cuda", device
    if device == "auto":
        found = "cuda" if torch.cuda.is_available() else "cpu"
        return found, f"auto -> {found} (this machine{'' if found == 'cuda' else ' has no GPU'}; "\
                      "pass training.device=cuda to plan for a GPU)"
    return "cpu", device


def _rollout(cfg, s: Shapes, *, wrapped: bool, compute_name: str, tp: int, dp: int, lora_extra: int = 0
             ) -> list[Item]:
    """What the decode loop holds on top of the resident state (see the module docstring). ``lora_extra``: the
    parameters ``model.lora`` adds (adapters and the reference's part), gathered with the rest."""
    compute = BYTES[compute_name]
    static = cfg.rollout.static_decode
    lora = cfg.model.lora.enabled
    items = [Item("unsharded model for decoding", (s.params + lora_extra) * compute / tp if wrapped else 0,
                  f"every FSDP unit gathered at once (titan/decode.py), {compute_name}"
                  if wrapped else "not FSDP-wrapped: decoding reads the parameters")]
    fused = tp == 1 and not static and not lora
    items.append(Item("fused gate/up weights", 2 * s.ffn * s.dim * s.n_layers * compute if fused else 0,
                      f"w1|w3 of {s.n_layers} layers concatenated per generation (titan/decode_step_plain.py)" if fused
                      else ("rollout.static_decode reads w1 and w3 as they are" if static else
                            "model.lora: decoded by the layers' forwards, adapters included" if lora else
                            "TP: decoded by the sub-modules")))
    from refexp.components.sampler import DROP_FINISHED_SHARE

    per_slot = s.n_layers * 2 * s.kv_dim * compute / tp

    def copied_rows(g: Generation) -> tuple[int, str]:  # rows of the second copy while a cache is copied
        repeat = g.distinct if g.distinct < g.rows else 0  # the prompts' cache -> the groups' rows
        dropped = 0 if static or g.rows < 2 else g.rows - math.ceil(DROP_FINISHED_SHARE * g.rows)
        return (dropped, "finished rows dropped") if dropped >= repeat else (repeat, "prompts repeated for groups")

    if static:  # the cache lives in the kept buckets (resident); an ordinary prefill of the prompts is copied in
        big = max(generations(cfg, dp), key=lambda g: g.distinct)
        items.append(Item("generation KV cache", 0, "in the kept static-decode buffers"))
        items.append(Item("KV cache while copied", big.distinct * cfg.task.max_prompt_len * per_slot,
                          f"the prefill of {big.distinct} prompts x {cfg.task.max_prompt_len} tokens, copied into "
                          "its bucket"))
    else:
        big = max(generations(cfg, dp), key=lambda g: (g.rows + copied_rows(g)[0]) * g.length)
        items.append(Item("generation KV cache", big.rows * big.length * per_slot,
                          f"{big.rows} rows x {big.length} tokens ({big.what} batch, the largest)"))
        extra, why = copied_rows(big)
        items.append(Item("KV cache while copied", extra * big.length * per_slot,
                          f"{extra} rows copied while the old cache lives ({why})" if extra else "no copy"))
    # sampler._Sampling.next_tokens: the step's float32 logits, log-softmax and probabilities, and the
    # float64 CDF of the inverse-CDF draw
    items.append(Item("decode logits and sampling", big.rows * s.vocab * (3 * 4 + 8),
                      f"{big.rows} rows x {s.vocab} vocab: float32 logits, log-probs, probs; float64 CDF"))
    return items


def _drift_measurement(cfg, s: Shapes, *, wrapped: bool, compute: int, tp: int, dp: int, lent: float) -> list[Item]:
    """What ``kl/init_exact`` holds on top of the resident state (``titan/exact_kl.py``), on the largest drift batch
    (``memory_rows.drift_generation``); ``lent``: the anchor's shards moved to the device (``reference.offload``)."""
    from refexp.titan.logprobs import FP32_CHUNK_ELEMENTS

    g = drift_generation(cfg, dp)
    positions = g.rows * cfg.task.max_new_tokens  # completion tokens: the positions the KL reads
    chunk = min(positions, max(1, FP32_CHUNK_ELEMENTS // s.vocab))
    kl_chunk = chunk * s.vocab * 3 * 4  # at most three float32 [chunk, V] at once (exact_kl._chunk_kl)
    # the anchor's forward, the policy's states held: its two blocks, then its lm_head unit, unsharded
    units = max(2 * s.block_params, s.head_params) * compute / tp if wrapped else 0
    items = [
        Item("anchor moved to the device", lent, "reference.offload: its shards, for the measurement" if lent
             else "stays put"),
        Item("policy's lm_head unit", s.head_params * compute / tp if wrapped else 0,
             "unsharded by its forward and kept so (a trainable model's last unit)" if wrapped else "not FSDP-wrapped"),
        Item("output layers gathered", 2 * s.vocab * s.dim * compute,
             f"the policy's and the anchor's whole [{s.vocab}, {s.dim}] output weights"
             + (" (TP: all-gathered)" if tp > 1 else "")),
        Item("final hidden states", 2 * positions * s.dim * compute,
             f"both models' at {g.rows} rows x {cfg.task.max_new_tokens} completion tokens"),
        Item("KL chunk, or the anchor's forward", max(kl_chunk, units),
             f"{chunk} of {positions} positions x {s.vocab} vocab at a time, 3 float32 copies" if kl_chunk >= units
             else "its 2 blocks or its lm_head unit unsharded: more than a chunk's log-softmaxes"),
    ]
    if tp > 1:  # the output layer still runs inside each forward, for its hooks (titan/exact_kl.py)
        items.append(Item("vocab-sharded logits", g.rows * g.length * s.vocab / tp * compute,
                          f"{g.rows} rows x {g.length} tokens x {s.vocab} vocab / {tp}, discarded"))
    return items


def _static_buckets(cfg, s: Shapes, compute: int, dp: int) -> Item:
    """``rollout.static_decode``'s kept K/V buffers (``titan/static_decode.py``): one per row bucket the run's
    generations use, each [bucket rows, n_kv, ``rollout.decode_capacity``, head_dim] per layer, held between
    generations."""
    from refexp.components.rollout import decode_capacity
    from refexp.titan.static_decode import bucket_rows

    buckets = sorted({bucket_rows(g.rows) for g in generations(cfg, dp)})
    capacity = decode_capacity(cfg)
    return Item(STATIC_BUFFERS, sum(buckets) * capacity * s.n_layers * 2 * s.kv_dim * compute,
                f"row buckets {'+'.join(map(str, buckets))} x {capacity} slots, kept between generations")


def _reduce_scatter_item(cfg, s: Shapes, *, wrapped: bool, master: int, split: int, tp: int, trainable: int
                         ) -> Item:
    """FSDP's reduce-scatter input for the lm_head unit: its unsharded gradient copied into a
    ``training.mixed_precision_reduce`` buffer (``torch.distributed.fsdp._fully_shard._fsdp_collectives.
    foreach_reduce``), held until the next unit's reduce-scatter. It lives at the start of backward, when the
    other units' gradients, which the "gradients" line counts, do not exist yet: it adds only what it exceeds
    them by (sharded runs; with one rank the gradients outweigh it)."""
    if not wrapped:
        return Item("lm_head unit reduce-scatter", 0, "not FSDP-wrapped")
    if cfg.model.lora.enabled:
        return Item("lm_head unit reduce-scatter", 0, "model.lora: the output layer is frozen (no gradient), or its "
                    "adapter's is counted among the gradients")
    reduce_name = cfg.training.mixed_precision_reduce
    buffer = s.head_params * BYTES[reduce_name] / tp
    not_yet = (trainable - s.head_params) * master / split
    return Item("lm_head unit reduce-scatter", max(0.0, buffer - not_yet),
                f"{buffer / GIB:.2f} GiB {reduce_name} copy of its gradient less the other units' gradients, "
                f"not yet computed ({not_yet / GIB:.2f} GiB)")


def _embedding_backward_item(cfg, s: Shapes, *, wrapped: bool, compute: int, tp: int, others: float) -> Item:
    """The end of backward: the embedding's own FSDP unit (untied: ``refexp/titan/build.py`` wraps
    ``tok_embeddings`` apart from lm_head) unsharded, its unsharded gradient in the compute dtype and the
    ``training.mixed_precision_reduce`` copy FSDP reduce-scatters, while every unit's gradient exists (the
    "gradients" line) and the activations, the logits and the other units are freed. The phase holds the larger of
    that moment and the chunk's peak, so this adds what it exceeds the chunk's other lines (``others``, all but the
    gradients) by: nothing at scale, the peak of a short chunk."""
    own = s.params - s.n_layers * s.block_params - s.head_params  # the embedding; 0 when tied to lm_head
    if not wrapped or own <= 0 or cfg.model.lora.enabled:
        return Item("embedding unit, end of backward", 0,
                    "not FSDP-wrapped" if not wrapped else "model.lora: the embedding is frozen (no gradient)"
                    if cfg.model.lora.enabled else "tied to lm_head: in the lm_head unit")
    reduce_name = cfg.training.mixed_precision_reduce
    end = own * (2 * compute + BYTES[reduce_name]) / tp
    return Item("embedding unit, end of backward", max(0.0, end - others),
                f"{end / GIB:.2f} GiB unsharded with its gradient and {reduce_name} copy, less the chunk's other "
                f"lines ({others / GIB:.2f} GiB)")


def _anchor_how(cfg, has_ref: bool) -> str:
    """How the plan describes a kl/init anchor kept as its own copy."""
    r = cfg.reference
    if has_ref and r.name == "fixed" and r.dtype not in (None, cfg.training.dtype):
        return (f"frozen copy in {cfg.training.dtype}: kl/init is measured in the policy's dtype for every strategy, "
                f"so the {r.dtype} reference cannot be it")
    return "frozen copy"


def static_decode_warning(p: MemoryPlan) -> str | None:
    """A warning when ``rollout.static_decode``'s kept K/V buffers outweigh the model's own memory (parameters,
    their gradients and the optimizer state), else None: the buffers are held for the whole run."""
    buffers = sum(i.bytes for i in p.resident if i.what == STATIC_BUFFERS)
    model = sum(i.bytes for i in p.resident if i.what in ("parameters", "optimizer state"))
    model += sum(i.bytes for i in p.phases.get("policy training", ()) if i.what == "gradients")
    if buffers <= model:
        return None
    return (f"warning: rollout.static_decode keeps {buffers / GIB:.2f} GiB of K/V buffers for the whole run, more than "
            f"the model's parameters, gradients and optimizer state ({model / GIB:.2f} GiB); a smaller "
            "rollout.decode_capacity, fewer rows per generation, or rollout.static_decode=false frees them")


def plan(cfg) -> MemoryPlan:
    """The per-rank memory plan of a validated RootConfig."""
    from refexp.reference import anchor, strategies

    world, rep, shard, tp = layout(cfg)
    dp = rep * shard
    device_type, device_how = planned_device(cfg)
    s = model_shapes(cfg.model, cfg.parallelism)
    split = shard * tp
    master = BYTES[cfg.training.dtype]
    compute_name = cfg.training.compute_dtype(device_type)
    compute = BYTES[compute_name]
    ref_cfg, a = cfg.reference, cfg.algo
    ref_bytes = BYTES[ref_cfg.dtype or cfg.training.dtype]
    wrapped = world > 1 or compute_name != cfg.training.dtype

    # the trainer's own decisions (refexp/reference/): where reference log-probs come from, whether the kl/init
    # anchor is the reference itself
    source = strategies.reference_source(cfg)
    has_ref = source in ("live", "versioned")  # precomputed: its log-probs are read from the table, the model freed
    ref_shards = s.params * ref_bytes / split
    start = Path("<the policy's start>")  # a dry run has no checkpoint: a reference.checkpoint is another one
    anchor_shared = anchor.anchor_is_reference(cfg, anchor.reference_start(cfg, start), start)
    has_anchor = a.name != "sft" and not (anchor_shared and has_ref)
    ref_master = s.params * ref_cfg.fp32_master_bytes(cfg.training.dtype) / split  # a bf16 EMA's fp32 master
    lora = lora_shapes(cfg.model, cfg.parallelism)
    trainable = lora.adapter_params if lora else s.params
    resident = [
        Item("parameters", s.params * master / split, f"{s.params / 1e9:.3f}B x {master} B / {split} ranks"
             + (" (the frozen base)" if lora else "")),
        Item("optimizer state", trainable * 8 / split, f"{cfg.training.optimizer}: 2 moments x 4 B / {split}"
             + (" of the adapters" if lora else "")),
    ]
    if lora:
        resident += _lora_items(cfg, lora, master=master, split=split, has_ref=has_ref)
    else:
        resident += [
            Item("reference", 0 if (ref_cfg.offload or not has_ref) else ref_shards + ref_master,
                 "host memory (reference.offload)" if has_ref and ref_cfg.offload else
                 (f"frozen copy, {ref_cfg.dtype or cfg.training.dtype}" + (" + float32 master" if ref_master else "")
                  if has_ref else "none")),
            Item("kl/init anchor", 0 if (ref_cfg.offload or not has_anchor) else s.params * master / split,
                 "the fixed reference itself" if not has_anchor and a.name != "sft" else
                 ("host memory (reference.offload)" if ref_cfg.offload and has_anchor else
                  (_anchor_how(cfg, has_ref) if has_anchor else "none"))),
        ]
    lora_extra = (lora.adapter_params + lora.reference_params(LORA_REFERENCE_STATE[ref_cfg.name])) if lora else 0
    from refexp.tasks.reward_model import reward_models_plan_line

    reward_models = reward_models_plan_line(cfg.task, s.params)  # learned rewards: beside the policy throughout
    if reward_models is not None:
        resident.append(Item(*reward_models))
    if cfg.rollout.static_decode:
        resident.append(_static_buckets(cfg, s, compute, dp))
        resident.append(Item("static-decode weights", s.params * compute / tp if wrapped else 0,
                             f"the whole model in {compute_name} at fixed addresses (titan/static_weights.py)"
                             if wrapped else "not FSDP-wrapped: the step reads the parameters"))
    out = MemoryPlan(device=device_how, compute=compute_name, resident=resident)
    out.phases["rollout"] = _rollout(cfg, s, wrapped=wrapped, compute_name=compute_name, tp=tp, dp=dp,
                                     lora_extra=lora_extra)

    chunk = training_chunk(cfg, dp)
    rows, length = chunk.rows, chunk.length
    kept, one_block = activation_elems_per_token(s, cfg.activation_checkpoint)
    tokens = rows * length
    positions, what = output_positions(chunk, tp)
    train_logits, train_logits_how = logit_bytes(positions, what, s, compute, tp, backward=True)
    ref_logits, ref_logits_how = logit_bytes(positions, what, s, compute, tp, backward=False)
    # model.lora's parameters inside the blocks are gathered with them (an adapted lm_head's: negligible)
    blocks = 2 * (s.block_params + lora_extra / s.n_layers) * compute / tp if wrapped else 0
    shared, shared_how = shared_attention_bytes(cfg, s, rows, length, compute, tp)
    out.phases["policy training"] = [
        Item("gradients", trainable * master / split, f"same as the {'adapters' if lora else 'parameters'} "
             f"({cfg.training.dtype})"),
        Item("FSDP unsharded blocks", blocks, "2 blocks in the compute dtype" if wrapped else "not FSDP-wrapped"),
        Item("norm + lm_head unit", (1 if lora else 2) * s.head_params * compute / tp if wrapped else 0,
             ("unsharded from forward to backward" + (" (frozen: no gradient)" if lora else
                                                      ", and its unsharded gradient")) if wrapped
             else "not FSDP-wrapped"),
        _reduce_scatter_item(cfg, s, wrapped=wrapped, master=master, split=split, tp=tp, trainable=trainable),
        Item("activations", tokens * (kept + one_block) * compute / tp,
             f"{rows} rows x {length} tokens, activation_checkpoint={cfg.activation_checkpoint.mode}"),
        Item("logits and log-probs", train_logits, f"{train_logits_how}, and their gradient"),
        Item("shared-prompt attention", shared, shared_how),
    ]
    others = sum(i.bytes for i in out.phases["policy training"][1:])  # every line but the gradients
    out.phases["policy training"].append(_embedding_backward_item(cfg, s, wrapped=wrapped, compute=compute, tp=tp,
                                                                  others=others))
    live_ref = source == "live"
    out.phases["reference forward"] = [
        Item("reference moved to the device", ref_shards if (live_ref and ref_cfg.offload) else 0,
             "reference.offload: its shards, for the forward" if live_ref and ref_cfg.offload else "stays put"),
        Item("reference unsharded units", (2 * s.block_params + s.head_params) * compute / tp
             if wrapped and live_ref else 0, "2 blocks and the lm_head unit" if wrapped and live_ref else "none"),
        Item("reference logits", ref_logits if live_ref else 0,
             f"{ref_logits_how}, no graph" if live_ref else "no live reference forward"),
    ]
    if a.name != "sft":  # an RL run measures its drift from the start at every evaluation
        out.phases["drift measurement"] = _drift_measurement(
            cfg, s, wrapped=wrapped, compute=compute, tp=tp, dp=dp,
            lent=s.params * master / split if ref_cfg.offload and (has_anchor or has_ref) else 0)
    saves_reference = (ref_cfg.name in MOVING_STRATEGIES and a.name != "sft"
                       and getattr(cfg.checkpoint, "save_reference", True))
    if lora:  # the adapters and their state, the reference's part; the frozen base is the start checkpoint's
        ref_part = lora.reference_params(LORA_REFERENCE_STATE[ref_cfg.name]) * master if saves_reference else 0
        out.checkpoint = Item("one checkpoint on disk (all ranks)", trainable * (master + 8) + ref_part,
                              "adapters + AdamW state" + (" + the reference's part" if ref_part else ""))
        return out
    ckpt = s.params * master + s.params * 8
    if saves_reference:
        ckpt += s.params * ref_bytes
    out.checkpoint = Item("one checkpoint on disk (all ranks)", ckpt, "weights + AdamW state" +
                          (" + moving reference" if ckpt > s.params * (master + 8) else ""))
    return out


def _lora_items(cfg, lora: LoRAShapes, *, master: int, split: int, has_ref: bool) -> list[Item]:
    """``model.lora``'s resident lines: the adapters, the reference (the policy's own base with the adapters off, a
    reference adapter, or a dense EMA delta with the float32 master a bf16 one keeps) and the kl/init anchor (the
    base with the adapters off: never a copy)."""
    r = cfg.reference
    state = LORA_REFERENCE_STATE[r.name]
    part = lora.reference_params(state)
    fp32 = 4 if state == "delta" and cfg.training.dtype != "float32" else 0
    how = {"none": "the base with the adapters off (model.lora): no copy" if has_ref else "none",
           "adapter": f"a reference adapter, {part / 1e6:.2f}M parameters (model.lora)",
           "delta": f"dense EMA delta of the {lora.layers} adapted layers, {part / 1e6:.1f}M parameters (model.lora)"
                    + (" + float32 master" if fp32 else "")}[state]
    return [
        Item("LoRA adapters", lora.adapter_params * master / split,
             f"rank {cfg.model.lora.rank} on {', '.join(lora.targets)} ({lora.layers} layers): "
             f"{lora.adapter_params / 1e6:.2f}M parameters, trained"),
        Item("reference", part * (master + fp32) / split, how),
        Item("kl/init anchor", 0, "the base with the adapters off (model.lora): no copy"),
    ]
