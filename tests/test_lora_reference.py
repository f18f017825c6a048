"""Each reference strategy of a LoRA policy (refexp/reference/lora.py) against its full-weight form
(refexp/reference/strategies.py) on a tiny model: the adapters-off reference and kl/init anchor give the frozen
copy's log-probs; right after a reset the reference is the policy; the exact EMA is the full-weight EMA of the
merged weights over several updates (averaging the factors is not); the state round-trips."""

from __future__ import annotations

import pytest
import torch

from refexp import titan
from refexp.config import (
    EMAReferenceConfig,
    FixedReferenceConfig,
    KLTriggeredReferenceConfig,
    NoReferenceConfig,
    PeriodicResetReferenceConfig,
)
from refexp.config.model import LORA_REFERENCE_STATE, LoRAConfig
from refexp.reference.anchor import InitAnchor
from refexp.reference.lora import LORA_REGISTRY, build_lora_reference
from refexp.reference.strategies import REGISTRY, build_reference
from refexp.titan.unwrap import local_tensor
from tests.helpers.models import tiny_model_config

VOCAB = 50
CFG = tiny_model_config(vocab_size=VOCAB)
LORA = LoRAConfig(rank=4, alpha=8.0)


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    """A start checkpoint (model-only DCP, as the SFT stage writes) of a randomly initialised tiny model."""
    path = tmp_path_factory.mktemp("start") / "model"
    titan.save_model_weights(titan.build_model(CFG, vocab_size=VOCAB, device="cpu", seed=7), path)
    return path


def _frozen(start):
    model = titan.build_model(CFG, vocab_size=VOCAB, device="cpu", seed=0, requires_grad=False)
    titan.load_weights(model, CFG, start)
    return model


def _policy(start, reference: str):
    model = titan.build_model(CFG, vocab_size=VOCAB, device="cpu", seed=1, lora=LORA,
                              lora_reference=LORA_REFERENCE_STATE[reference])
    titan.load_weights(model, CFG, start)
    return model


def _train_(policy, seed: int) -> None:
    """Stand-in for an optimizer step: new adapter values (B away from 0)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in titan.lora.adapted_modules(policy).values():
            for part in (m.lora_a, m.lora_b):  # one process: the local shard is the whole tensor
                local_tensor(part.weight).add_(0.1 * torch.randn(part.weight.shape, generator=gen))


def _tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (3, 12), generator=torch.Generator().manual_seed(4))


def _policy_logprobs(policy) -> torch.Tensor:
    with torch.no_grad():
        return titan.token_logprobs(policy, _tokens())


@torch.no_grad()
def _merged_copy(policy, start) -> torch.nn.Module:
    """A plain model holding the policy's merged weights W + scale * B A (what the HF export writes)."""
    model = _frozen(start)
    params = dict(model.named_parameters())
    for name, m in titan.lora.adapted_modules(policy).items():
        params[f"{name}.weight"].copy_(titan.lora.merged_full(m, m.weight))
    return model


def test_every_strategy_has_a_lora_form():
    assert LORA_REGISTRY.keys() == REGISTRY.keys() == LORA_REFERENCE_STATE.keys()


def test_fixed_is_the_base_with_the_adapters_off_and_equals_the_frozen_copy(start):
    policy = _policy(start, "fixed")
    copy = build_reference(FixedReferenceConfig(), lambda: _frozen(start))
    lora = build_lora_reference(FixedReferenceConfig(), policy)
    _train_(policy, 1)
    assert not torch.allclose(_policy_logprobs(policy), copy.logprobs(_tokens()))  # the policy moved
    assert torch.equal(lora.logprobs(_tokens()), copy.logprobs(_tokens()))
    assert lora.model is policy and lora.state_dict() == {"version": 0, "last_update_step": 0}
    assert not lora.after_step(1, policy, {"kl/ref": 1.0})


@pytest.mark.parametrize("reference", ["fixed", "periodic_reset", "ema", "kl_triggered", "none"])
def test_the_kl_init_anchor_is_the_base_with_the_adapters_off(start, reference):
    policy = _policy(start, reference)
    _train_(policy, 2)
    anchor = InitAnchor(lambda: pytest.fail("a LoRA anchor builds nothing"), None, lora_policy=policy)
    with anchor.logprobs() as fn:
        got = fn(_tokens())
    with torch.no_grad():
        want = titan.token_logprobs(_frozen(start), _tokens())
    assert torch.equal(got, want)
    # kl/init_exact reads the anchor's whole distributions: the policy itself, entered with its adapters off
    tokens = _tokens()
    select = torch.ones(tokens.shape[0], tokens.shape[1] - 1, dtype=torch.bool)
    with anchor.frozen() as frozen:
        exact = titan.token_kl(policy, frozen, tokens, select_BT=select)
    assert torch.equal(exact, titan.token_kl(policy, _frozen(start), tokens, select_BT=select))
    assert float(exact.sum()) > 0  # trained adapters: the policy view is not the base's


@pytest.mark.parametrize("reference, cfg, metrics", [
    ("periodic_reset", PeriodicResetReferenceConfig(reset_every=2), {}),
    ("kl_triggered", KLTriggeredReferenceConfig(kl_threshold=0.01, min_gap=1), {"kl/ref": 0.5}),
])
def test_right_after_a_reset_the_reference_is_the_policy(start, reference, cfg, metrics):
    policy = _policy(start, reference)
    strategy = build_lora_reference(cfg, policy)
    start_logp = titan.token_logprobs(_frozen(start), _tokens()).detach()
    assert torch.equal(strategy.logprobs(_tokens()), start_logp)  # before any reset: the start model
    _train_(policy, 1)
    moved = reference == "kl_triggered"  # kl_triggered fires at its first step; periodic_reset at step 2
    assert strategy.after_step(1, policy, metrics) == moved
    if not moved:
        assert torch.equal(strategy.logprobs(_tokens()), start_logp)
        _train_(policy, 2)
        assert strategy.after_step(2, policy, metrics)
    assert torch.equal(strategy.logprobs(_tokens()), _policy_logprobs(policy))
    kept = strategy.logprobs(_tokens())
    _train_(policy, 3)  # the policy moves on; the reference adapter stays where the reset put it
    assert torch.equal(strategy.logprobs(_tokens()), kept)
    assert strategy.version == 1


def test_the_exact_ema_is_the_full_weight_ema_of_the_merged_weights(start):
    alpha = 0.3
    policy = _policy(start, "ema")
    strategy = build_lora_reference(EMAReferenceConfig(alpha=alpha, sync_every=1), policy)
    full = build_reference(EMAReferenceConfig(alpha=alpha, sync_every=1), lambda: _frozen(start))
    # the approximation TRL's open fix proposes: the average of each factor, then their product
    factors = {name: (m.lora_a.weight.detach().clone(), m.lora_b.weight.detach().clone())
               for name, m in titan.lora.adapted_modules(policy).items()}
    factor_ema = _frozen(start)
    for step in range(1, 5):
        _train_(policy, step)
        strategy.after_step(step, policy, {})
        full.after_step(step, _merged_copy(policy, start), {})
        with torch.no_grad():
            params = dict(factor_ema.named_parameters())
            base = dict(_frozen(start).named_parameters())
            for name, m in titan.lora.adapted_modules(policy).items():
                a, b = factors[name]
                a.lerp_(m.lora_a.weight, alpha)
                b.lerp_(m.lora_b.weight, alpha)
                params[f"{name}.weight"].copy_(base[f"{name}.weight"] + m._lora_scaling * b @ a)
        got, want = strategy.logprobs(_tokens()), full.logprobs(_tokens())
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        approx = titan.token_logprobs(factor_ema, _tokens()).detach()
        assert (approx - want).abs().max() > 100 * (got - want).abs().max() + 1e-3, f"step {step}"
    assert strategy.version == full.version == 4
    assert not torch.allclose(got, _policy_logprobs(policy), atol=1e-3)  # it trails the policy


def test_a_bf16_ema_delta_accumulates_in_its_float32_master(start):
    policy = titan.build_model(CFG, vocab_size=VOCAB, device="cpu", seed=1, dtype="bfloat16", lora=LORA,
                               lora_reference="delta")
    strategy = build_lora_reference(EMAReferenceConfig(alpha=0.05, sync_every=1), policy)
    assert strategy.master is not None and all(t.dtype == torch.float32 for t in strategy.master.values())
    _train_(policy, 1)
    for step in range(1, 4):
        strategy.after_step(step, policy, {})
    name, m = next(iter(titan.lora.adapted_modules(policy).items()))
    want = (1 - (1 - 0.05) ** 3) * titan.lora.weight_update(m)  # the same update three times
    torch.testing.assert_close(strategy.master[f"{name}.ref_delta.weight"], want, atol=1e-6, rtol=1e-5)


def test_the_state_round_trips_with_the_reference_part_in_the_policy(start):
    policy = _policy(start, "ema")
    strategy = build_lora_reference(EMAReferenceConfig(alpha=0.5, sync_every=1), policy)
    _train_(policy, 1)
    strategy.after_step(1, policy, {})
    states = titan.AdapterStates(policy).state_dict()
    assert any(k.endswith("ref_delta.weight") for k in states) and all("lora_" in k or "ref_" in k for k in states)
    assert strategy.state_dict() == {"version": 1, "last_update_step": 1}  # the delta is in the model part
    assert not any("ref_" in k for k in titan.AdapterStates(policy, with_reference=False).state_dict())


def test_none_builds_nothing():
    strategy = build_lora_reference(NoReferenceConfig(), torch.nn.Linear(1, 1))
    assert strategy.model is None and strategy.logprobs(_tokens()) is None


@pytest.mark.numerics
def test_in_bf16_compute_the_reset_reference_is_the_policy_bit_for_bit(start):
    """FSDP's mixed precision (1-rank mesh on CPU) casts the reference adapter as it casts the adapters, so right
    after a reset the reference's bf16 forward is the policy's exactly; the base view is the bf16 frozen copy's."""
    from refexp.config import TrainingConfig

    bf16 = TrainingConfig(mixed_precision_param="bfloat16")
    policy = titan.build_model(CFG, vocab_size=VOCAB, device="cpu", seed=1, training_cfg=bf16, lora=LORA,
                               lora_reference="adapter")
    titan.load_weights(policy, CFG, start)
    frozen = titan.build_model(CFG, vocab_size=VOCAB, device="cpu", training_cfg=bf16, requires_grad=False)
    titan.load_weights(frozen, CFG, start)
    _train_(policy, 1)
    strategy = build_lora_reference(PeriodicResetReferenceConfig(reset_every=1), policy)
    assert strategy.after_step(1, policy, {})
    assert torch.equal(strategy.logprobs(_tokens()), _policy_logprobs(policy))
    with titan.lora_view(policy, titan.lora.BASE), torch.inference_mode():
        base = titan.token_logprobs(policy, _tokens())
    with torch.inference_mode():
        assert torch.equal(base, titan.token_logprobs(frozen, _tokens()))
