"""Reference-strategy semantics on a tiny torchtitan model."""

from __future__ import annotations

import torch

from refexp import titan
from refexp.config import (
    EMAReferenceConfig,
    FixedReferenceConfig,
    KLTriggeredReferenceConfig,
    ModelConfig,
    NoReferenceConfig,
    PeriodicResetReferenceConfig,
)
from refexp.reference.strategies import REGISTRY, build_reference

MODEL = ModelConfig(dim=32, n_layers=2, n_heads=2, n_kv_heads=2, ffn_hidden_dim=64, max_seq_len=32)


def _model(seed: int, trainable: bool = False):
    titan.prepare_torchtitan("cpu")
    return titan.build_model(MODEL, vocab_size=17, device=torch.device("cpu"), seed=seed, requires_grad=trainable)


def _params(m):
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def _perturb_(policy, step):
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01 * step)


def test_registry_has_every_strategy():
    assert set(REGISTRY) == {"fixed", "periodic_reset", "ema", "kl_triggered", "none"}


def test_periodic_reset_copies_the_policy_exactly_at_multiples_of_reset_every():
    policy = _model(1, trainable=True)
    strat = build_reference(PeriodicResetReferenceConfig(reset_every=3), lambda: _model(0))
    changed_at = []
    for step in range(1, 10):
        _perturb_(policy, step)
        before = _params(strat.model)
        if strat.after_step(step, policy, {}):
            changed_at.append(step)
            for k, v in strat.model.state_dict().items():
                assert torch.equal(v, policy.state_dict()[k]), k
        else:
            assert all(torch.equal(before[k], v) for k, v in strat.model.state_dict().items())
    assert changed_at == [3, 6, 9]
    assert strat.version == 3 and strat.last_update_step == 9


def test_ema_matches_the_formula():
    alpha = 0.3
    policy = _model(1, trainable=True)
    strat = build_reference(EMAReferenceConfig(alpha=alpha, sync_every=2), lambda: _model(0))
    ref0, pol = _params(strat.model), _params(policy)
    assert not strat.after_step(1, policy, {})
    assert strat.after_step(2, policy, {})
    for k, v in strat.model.state_dict().items():
        torch.testing.assert_close(v, alpha * pol[k] + (1 - alpha) * ref0[k], rtol=0, atol=1e-6)
    assert strat.version == 1


def test_kl_triggered_resets_above_threshold_with_a_minimum_gap():
    policy = _model(1, trainable=True)
    strat = build_reference(KLTriggeredReferenceConfig(kl_threshold=0.1, min_gap=3), lambda: _model(0))
    fired = [s for s, kl in enumerate([0.05, 0.2, 0.3, 0.3, 0.3, 0.01, 0.5], start=1)
             if strat.after_step(s, policy, {"kl/ref": kl})]
    # step 2 is above the threshold but within min_gap of the start (step 0); 4-5 within the gap of 3;
    # step 6 is below the threshold; step 7 fires again.
    assert fired == [3, 7]
    assert strat.version == 2 and strat.last_update_step == 7


def test_none_never_builds_a_model():
    def forbidden():
        raise AssertionError("reference=none must not build a model")

    strat = build_reference(NoReferenceConfig(), forbidden)
    assert strat.model is None
    assert strat.logprobs(torch.zeros(2, 5, dtype=torch.long)) is None
    assert not strat.after_step(1, _model(1), {"kl/ref": 1.0})


def test_fixed_never_moves_and_returns_frozen_logprobs():
    ref = _model(0)
    strat = build_reference(FixedReferenceConfig(), lambda: ref)
    before = _params(ref)
    for s in range(1, 5):
        assert not strat.after_step(s, _model(1), {"kl/ref": 9.0})
    assert all(torch.equal(before[k], v) for k, v in ref.state_dict().items())
    tokens = torch.randint(0, 17, (3, 7))
    lp = strat.logprobs(tokens)
    assert lp.shape == (3, 6) and not lp.requires_grad and not lp.is_inference()
    torch.testing.assert_close(lp, titan.token_logprobs(ref, tokens).detach())


def test_state_dict_round_trip_restores_version_and_weights():
    policy = _model(1, trainable=True)
    a = build_reference(PeriodicResetReferenceConfig(reset_every=2), lambda: _model(0))
    _perturb_(policy, 1)
    a.after_step(2, policy, {})
    sd = a.state_dict()
    b = build_reference(PeriodicResetReferenceConfig(reset_every=2), lambda: _model(0))
    b.load_state_dict(sd)
    assert (b.version, b.last_update_step) == (1, 2)
    for k, v in b.model.state_dict().items():
        assert torch.equal(v, a.model.state_dict()[k])
