"""LoRA adapters on the policy (``model.lora``): torchtitan 0.3.0's ``LoRAConverter`` (rank, alpha, target modules,
frozen base) with what refexp adds to each adapted linear layer, so that every reference strategy is exact without a
second copy of the model:

- a *view* switch (``lora_view``): ``policy`` (base + adapters, torchtitan's forward), ``base`` (the adapters off:
  the start model, so the fixed reference and the kl/init anchor), ``reference`` (what the layer keeps for the
  reference strategy);
- the reference's own part, by strategy (``config.model.LORA_REFERENCE_STATE``): none (``fixed``: the reference
  view is the base), a frozen reference adapter (``adapter``: ref_b ref_a, set to the adapters at each reset, so
  reference = base + reference adapter exactly), or a dense delta (``delta``: the running average of the adapters'
  weight update ``scale * B A``, which is not low-rank; reference = base + delta exactly);
- adapters initialised from ``training.seed`` on full tensors (``init_adapters_``), the same at any world size;
- the HF export's merged weight ``W + scale * B A`` (``merged_full``), and the checkpoint's model part reduced to
  the adapters and the reference's part (``AdapterStates``).

The reference parts are frozen parameters of the layer, so FSDP shards, gathers and casts them exactly as the
adapters: right after a reset the reference's forward is the policy's, bit for bit, in bf16 too. Where each
strategy's meaning and cost under LoRA are written: docs/algorithms.md, "LoRA policies".
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Iterator

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor, distribute_tensor
from torchtitan.components.checkpointer.base import ModelWrapper
from torchtitan.components.lora import LoRAConverter, _get_lora_cls, _lora_adapter_sharding
from torchtitan.models.common.linear import Linear
from torchtitan.protocols.module import Module
from torchtitan.protocols.sharding import ShardingConfig

from refexp.config import ConfigError
from refexp.config.model import LoRAConfig
from refexp.titan.unwrap import canonical_name, full_tensor, local_tensor, reshard_fsdp

POLICY, BASE, REFERENCE = "policy", "base", "reference"
VIEWS = (POLICY, BASE, REFERENCE)
REFERENCE_STATES = ("none", "adapter", "delta")
ADAPTER_PARTS = ("lora_a", "lora_b")
REFERENCE_PARTS = {"none": (), "adapter": ("ref_a", "ref_b"), "delta": ("ref_delta",)}

_classes: dict[type, type] = {}


def _adapted_cls(parent_cls: type) -> type:
    """torchtitan's LoRA subclass of ``parent_cls`` (e.g. Linear) with refexp's view switch and reference part."""
    if parent_cls in _classes:
        return _classes[parent_cls]
    titan_cls = _get_lora_cls(parent_cls)

    class AdaptedLinear(titan_cls):  # type: ignore[valid-type, misc]
        @dataclass(kw_only=True, slots=True)
        class Config(titan_cls.Config):  # type: ignore[misc, name-defined]
            reference_state: str = "none"

        def __init__(self, config) -> None:
            super().__init__(config)
            self.view = POLICY
            self.reference_state = config.reference_state
            a_sharding, b_sharding = _lora_adapter_sharding(config.sharding_config)
            zeros = {"weight": nn.init.zeros_}  # init_adapters_ sets them; zeros keep a meta build cheap to init
            if config.reference_state == "adapter":
                self.ref_a = Linear.Config(in_features=config.in_features, out_features=config.rank, bias=False,
                                           sharding_config=a_sharding, param_init=zeros).build()
                self.ref_b = Linear.Config(in_features=config.rank, out_features=config.out_features, bias=False,
                                           sharding_config=b_sharding, param_init=zeros).build()
            elif config.reference_state == "delta":
                base = config.sharding_config.state_shardings.get("weight") if config.sharding_config else None
                self.ref_delta = Linear.Config(
                    in_features=config.in_features, out_features=config.out_features, bias=False,
                    sharding_config=ShardingConfig(state_shardings={"weight": base}) if base is not None else None,
                    param_init=zeros).build()
            for part in REFERENCE_PARTS[config.reference_state]:
                getattr(self, part).requires_grad_(False)

        def forward(self, input: torch.Tensor) -> torch.Tensor:
            if self.view == POLICY:
                return super().forward(input)  # torchtitan's: base + scale * B A x
            base = parent_cls.forward(self, input)
            if self.view == BASE or self.reference_state == "none":
                return base
            if self.reference_state == "adapter":
                return base + self._lora_scaling * self.ref_b(self.ref_a(input))
            return base + self.ref_delta(input)

    AdaptedLinear.__name__ = AdaptedLinear.__qualname__ = f"Adapted{parent_cls.__name__}"
    _classes[parent_cls] = AdaptedLinear
    return AdaptedLinear


class _Converter(LoRAConverter):
    """torchtitan's converter, building refexp's adapted layers (with the reference part ``reference_state``)."""

    def __init__(self, config: LoRAConverter.Config, reference_state: str) -> None:
        super().__init__(config)
        self.reference_state = reference_state

    def _make_lora_config(self, cfg: Linear.Config):
        return _adapted_cls(cfg._owner).Config(
            **{f.name: getattr(cfg, f.name) for f in fields(cfg) if f.init},
            rank=self.rank, alpha=self.alpha, reference_state=self.reference_state)


def _linear_configs(model_config: Module.Config) -> list[tuple[str, Linear.Config]]:
    return [(fqn, c) for fqn, c, _, _ in model_config.traverse(Module.Config, recurse=True)
            if isinstance(c, Linear.Config)]


def target_names(model_config: Module.Config, lora: LoRAConfig) -> list[str]:
    """The layer names ``model.lora.target_modules`` stands for (None: every linear layer of the blocks)."""
    if lora.target_modules is not None:
        return list(lora.target_modules)
    return sorted({fqn.rsplit(".", 1)[-1] for fqn, _ in _linear_configs(model_config) if fqn.startswith("layers.")})


def lora_targets(model_config: Module.Config, lora: LoRAConfig) -> list[tuple[str, int, int]]:
    """``(name, in_features, out_features)`` of every layer ``model.lora`` adapts in a (torchtitan) model config;
    ``ConfigError`` for a target name that matches no linear layer or a rank larger than a target's dimension."""
    linears = _linear_configs(model_config)
    names = target_names(model_config, lora)
    found = {fqn.rsplit(".", 1)[-1] for fqn, _ in linears}
    missing = [n for n in names if n not in found]
    if missing:
        raise ConfigError(f"model.lora.target_modules={names} is invalid: {', '.join(map(repr, missing))} matches no "
                          f"linear layer of this model (its linear layers: {', '.join(sorted(found))})")
    targets = [(fqn, c.in_features, c.out_features) for fqn, c in linears if fqn.rsplit(".", 1)[-1] in names]
    if getattr(model_config, "enable_weight_tying", False) and any(fqn == "lm_head" for fqn, _, _ in targets):
        raise ConfigError(f"model.lora.target_modules={names} is invalid: lm_head is tied to the token embedding in "
                          f"this model, and an adapter on it alone would untie them (the HF export could not write "
                          f"it); expected the blocks' layers")
    fqn, n_in, n_out = min(targets, key=lambda t: min(t[1], t[2]))
    if lora.rank > min(n_in, n_out):
        raise ConfigError(f"model.lora.rank={lora.rank} is invalid: {fqn} is {n_out} x {n_in}, so an adapter of it "
                          f"has rank at most {min(n_in, n_out)}; expected a rank <= {min(n_in, n_out)}")
    return targets


def apply_lora(model_config: Module.Config, lora: LoRAConfig, reference_state: str = "none") -> Module.Config:
    """``model_config`` with every target linear layer adapted (torchtitan's ``LoRAConverter``: the rest frozen),
    each carrying ``reference_state``'s part (``REFERENCE_STATES``). Checks the targets first (``lora_targets``)."""
    if reference_state not in REFERENCE_STATES:
        raise ValueError(f"reference_state={reference_state!r} is invalid: expected one of {REFERENCE_STATES}")
    lora_targets(model_config, lora)
    converter = _Converter(LoRAConverter.Config(rank=lora.rank, alpha=lora.scale * lora.rank,
                                                target_modules=target_names(model_config, lora)), reference_state)
    return converter.convert(model_config)


def adapted_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Canonical name (``layers.0.attention.qkv_linear.wqkv``) -> adapted layer, in the model's order (every rank
    the same: the collectives below walk it)."""
    return {canonical_name(n): m for n, m in model.named_modules() if type(m) in _classes.values()}


def has_adapters(model: nn.Module) -> bool:
    return any(type(m) in _classes.values() for m in model.modules())


def is_adapted(module: nn.Module) -> bool:
    return type(module) in _classes.values()


def low_rank_in_view(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor, float] | None:
    """What an adapted layer adds to its base ``W x`` in its current view, as ``(A [r, in], B [out, r], scale)``
    (the forward is ``W x + scale * B A x``): the adapters in the policy view, the reference adapter in the
    reference view of ``adapter``; None where it adds nothing (a layer without adapters, the base view, the
    reference view of ``none``). ``NotImplementedError`` for the reference view of ``delta``: a dense delta, not
    low-rank. The tensors are the parameters themselves (no copy)."""
    if not is_adapted(module) or module.view == BASE:
        return None
    if module.view == POLICY:
        return module.lora_a.weight, module.lora_b.weight, module._lora_scaling
    if module.reference_state == "adapter":
        return module.ref_a.weight, module.ref_b.weight, module._lora_scaling
    if module.reference_state == "delta":
        raise NotImplementedError("the reference view of a dense delta is not low-rank")
    return None


def reference_state_of(model: nn.Module) -> str:
    """What the adapted layers keep for the reference (``REFERENCE_STATES``)."""
    return next(iter(adapted_modules(model).values())).reference_state


def is_adapter_name(name: str, *, reference: bool = True) -> bool:
    """Whether a parameter or state-dict name is an adapter's (``lora_a``/``lora_b``) or, with ``reference``, a
    reference part's: what a LoRA checkpoint holds of the model, and what a start checkpoint does not."""
    parts = ADAPTER_PARTS + (("ref_a", "ref_b", "ref_delta") if reference else ())
    return any(f".{p}." in name for p in parts)


@contextmanager
def lora_view(model: nn.Module, view: str) -> Iterator[None]:
    """Within the block every adapted layer of ``model`` computes ``view`` (``VIEWS``); the previous view after."""
    if view not in VIEWS:
        raise ValueError(f"view={view!r} is invalid: expected one of {VIEWS}")
    modules = list(adapted_modules(model).values())
    before = [m.view for m in modules]
    for m in modules:
        m.view = view
    try:
        yield
    finally:
        for m, v in zip(modules, before):
            m.view = v


@dataclass(frozen=True)
class LoRAView:
    """A LoRA model read in another view (``VIEWS``) than its own: what the kl/init anchor of a LoRA policy is (the
    policy with its adapters off), handed where a frozen model is expected and entered with ``viewed``."""

    model: nn.Module
    view: str


@contextmanager
def viewed(model: "nn.Module | LoRAView") -> Iterator[nn.Module]:
    """``with viewed(m) as module:`` the module to run; a ``LoRAView``'s model computing its view within the block."""
    if isinstance(model, LoRAView):
        with lora_view(model.model, model.view):
            yield model.model
    else:
        yield model


def _set_from_full_(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy this rank's part of the full tensor ``full`` into ``param`` (a DTensor's local shard; no communication:
    every rank holds the same ``full``)."""
    if isinstance(param, DTensor):
        full = distribute_tensor(full.to(param.device), param.device_mesh, param.placements, src_data_rank=None)
    local_tensor(param).copy_(local_tensor(full))


@torch.no_grad()
def init_adapters_(model: nn.Module, seed: int) -> None:
    """Adapters as torchtitan initialises them (A: Kaiming-uniform, bound 1/sqrt(in); B: 0, so the policy starts as
    the base), drawn on full tensors from ``seed`` in the layers' order: the same values at any world size. The
    reference parts start as the reference does, at the start model: the reference adapter a copy of the adapters,
    the delta 0."""
    reshard_fsdp(model)
    gen = torch.Generator().manual_seed(seed)
    for m in adapted_modules(model).values():
        a = m.lora_a.weight
        bound = 1.0 / math.sqrt(a.shape[1])
        a_full = torch.empty(tuple(a.shape), dtype=torch.float32).uniform_(-bound, bound, generator=gen).to(a.dtype)
        _set_from_full_(a, a_full)
        local_tensor(m.lora_b.weight).zero_()
        if m.reference_state == "adapter":
            local_tensor(m.ref_a.weight).copy_(local_tensor(a))
            local_tensor(m.ref_b.weight).zero_()
        elif m.reference_state == "delta":
            local_tensor(m.ref_delta.weight).zero_()


def delta_master(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """A float32 copy of every delta (sharded as it is) that ``update_reference_`` accumulates into when the model's
    dtype is not float32 (as ``copies.fp32_master`` for a full EMA reference: a bf16 delta alone stalls); None when
    there is nothing to keep."""
    deltas = {f"{name}.ref_delta.weight": m.ref_delta.weight for name, m in adapted_modules(model).items()
              if m.reference_state == "delta"}
    if all(d.dtype == torch.float32 for d in deltas.values()):
        return None
    return {name: d.detach().to(torch.float32, copy=True) for name, d in deltas.items()}


def weight_update(m: nn.Module) -> torch.Tensor:
    """This rank's rows of the adapter's float32 weight update ``scale * B A`` [out, in], laid out like the layer's
    weight (a collective: A is gathered; FSDP shards B and the weight by the same rows)."""
    b = m.lora_b.weight
    if isinstance(b, DTensor) and b.placements != m.weight.placements:
        raise NotImplementedError(f"the adapter's B is laid out {b.placements}, its weight {m.weight.placements}")
    a_full = full_tensor(m.lora_a.weight).float()
    return m._lora_scaling * (local_tensor(b).float() @ a_full)


@torch.no_grad()
def update_reference_(model: nn.Module, alpha: float, master: dict[str, torch.Tensor] | None = None) -> None:
    """The reference part of every adapted layer moved towards the current adapters: ``adapter`` copies them
    (``alpha`` must be 1: a reset), ``delta`` takes ``delta <- alpha * scale * B A + (1 - alpha) * delta``, which is
    the full-weight EMA ``ref <- alpha * policy + (1 - alpha) * ref`` of the merged weights exactly, since policy and
    reference share the base W. ``master`` (``delta_master``): the blend accumulates there in float32.
    Collective under FSDP (every rank calls it)."""
    reshard_fsdp(model)
    for name, m in adapted_modules(model).items():
        if m.reference_state == "adapter":
            if alpha != 1.0:
                raise ValueError(f"a reference adapter is reset (alpha=1), not blended (alpha={alpha})")
            local_tensor(m.ref_a.weight).copy_(local_tensor(m.lora_a.weight))
            local_tensor(m.ref_b.weight).copy_(local_tensor(m.lora_b.weight))
        elif m.reference_state == "delta":
            update = weight_update(m)
            delta = local_tensor(m.ref_delta.weight)
            acc = local_tensor(master[f"{name}.ref_delta.weight"]) if master is not None else None
            if acc is None:
                delta.copy_(delta.float().lerp_(update, alpha))
            else:
                acc.lerp_(update.to(acc.device), alpha)
                delta.copy_(acc)


@torch.no_grad()
def merged_full(m: nn.Module, full_weight: torch.Tensor) -> torch.Tensor:
    """The full merged weight ``W + scale * B A`` of adapted layer ``m`` (``full_weight``: its gathered W), in W's
    dtype, summed in float32 (a collective: A and B are gathered)."""
    a, b = full_tensor(m.lora_a.weight).float(), full_tensor(m.lora_b.weight).float()
    return (full_weight.float() + m._lora_scaling * (b.to(full_weight.device) @ a.to(full_weight.device))
            ).to(full_weight.dtype)


def count_adapter_parameters(model: nn.Module, *, reference: bool = False) -> int:
    """Parameters of the adapters (with ``reference``: of the reference parts instead), whole model."""
    parts = tuple(p for s in REFERENCE_PARTS.values() for p in s) if reference else ADAPTER_PARTS
    return sum(getattr(m, p).weight.numel() for m in adapted_modules(model).values() for p in parts if hasattr(m, p))


class AdapterStates(ModelWrapper):
    """The checkpoint's model part of a LoRA policy: the adapters and (``with_reference``) the reference parts, not
    the frozen base, which is the start checkpoint's (pinned by its sha256 like every start:
    ``components/run_identity.py``) and loaded from it before a resume."""

    def __init__(self, model: nn.Module, *, with_reference: bool = True) -> None:
        self.with_reference = with_reference
        super().__init__(model)

    def _get_state_dict(self) -> dict:
        return {canonical_name(n): p for model in self.model for n, p in model.named_parameters()
                if is_adapter_name(canonical_name(n), reference=self.with_reference)}
