"""A moving reference stored in bf16: an EMA accumulates in an fp32 master (refexp/reference/strategies.py), so small
policy changes are not lost to bf16's 8-bit significand."""

from __future__ import annotations

import pytest
import torch

from refexp import titan
from refexp.config import EMAReferenceConfig, ModelConfig, PeriodicResetReferenceConfig
from refexp.reference.strategies import build_reference

pytestmark = pytest.mark.numerics  # tests/README.md: run under other CPU kernels too

MODEL = ModelConfig(dim=32, n_layers=2, n_heads=2, n_kv_heads=2, ffn_hidden_dim=64, max_seq_len=32)
ALPHA, UPDATES, DRIFT = 0.05, 200, 5e-5
"""TR-DPO's soft update at the quickstart's alpha; the policy starts at the reference's weights (as a run starts
both from the SFT model) and each step moves by DRIFT * N(0, 1) per weight (init std 0.02: a quarter of a
percent; measured: 30% of the elements the exact EMA moves stay frozen without the master, 0 with it)."""


def _model(seed: int, dtype: str):
    titan.prepare_torchtitan("cpu")
    return titan.build_model(MODEL, vocab_size=17, device=torch.device("cpu"), seed=seed, dtype=dtype,
                             requires_grad=False)


def _weights(m) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in m.named_parameters()}


def _run_ema(*, master: bool):
    """UPDATES EMA steps of a bf16 reference towards a drifting fp32 policy; returns the reference's start and
    final weights and an fp32 EMA of the same policy computed here, ref <- ref + alpha * (policy - ref)."""
    policy = _model(1, "float32")
    strat = build_reference(EMAReferenceConfig(alpha=ALPHA), lambda: _model(0, "bfloat16"))
    with torch.no_grad():
        for p, r in zip(policy.parameters(), strat.model.parameters()):
            p.copy_(r)
    assert (strat.master is not None) and next(strat.model.parameters()).dtype == torch.bfloat16
    if not master:
        strat.master = None  # the reference as it was before the master: the blend in bf16
    start = _weights(strat.model)
    want = {n: w.to(torch.float64) for n, w in start.items()}
    gen = torch.Generator().manual_seed(0)
    for step in range(1, UPDATES + 1):
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(DRIFT * torch.randn(p.shape, generator=gen))
        pol = dict(policy.named_parameters())
        for n in want:
            want[n] = want[n] + ALPHA * (pol[n].detach().to(torch.float64) - want[n])
        assert strat.after_step(step, policy, {})
    return start, _weights(strat.model), want


def _frozen_fraction(start, final, want) -> float:
    """Of the elements the exact EMA moved by more than a bf16 ulp, the fraction the reference never moved."""
    should, stuck = 0, 0
    for n, w in want.items():
        s = start[n].to(torch.float64)
        moved = (w - s).abs() > s.abs() * 2**-7 + 1e-30
        should += int(moved.sum())
        stuck += int((moved & (final[n] == start[n])).sum())
    assert should > 0.5 * sum(w.numel() for w in want.values())  # the policy drifts far enough to matter
    return stuck / should


def test_a_bf16_ema_reference_follows_the_fp32_ema_with_its_master():
    start, final, want = _run_ema(master=True)
    assert _frozen_fraction(start, final, want) < 0.01
    for n, w in want.items():
        # within bf16's rounding of the exact EMA: one ulp, 2**-7 of the value, at most
        torch.testing.assert_close(final[n].to(torch.float64), w, rtol=2**-7, atol=1e-12, msg=n)


def test_without_the_master_a_bf16_ema_reference_mostly_stalls():
    """What the master is for (and that the test above can fail): the same run blended in bf16."""
    start, final, want = _run_ema(master=False)
    assert _frozen_fraction(start, final, want) > 0.2
    worst = max(float(((final[n].to(torch.float64) - w).abs() / w.abs().clamp(min=1e-30)).max())
                for n, w in want.items())
    assert worst > 2**-7


def test_hard_resets_and_fp32_references_keep_no_master():
    """A reset is an exact copy; an fp32 EMA is its own master: no extra 4 bytes per parameter."""
    reset = build_reference(PeriodicResetReferenceConfig(), lambda: _model(0, "bfloat16"))
    ema32 = build_reference(EMAReferenceConfig(), lambda: _model(0, "float32"))
    assert reset.master is None and ema32.master is None
    assert EMAReferenceConfig().fp32_master_bytes("bfloat16") == 4
    assert EMAReferenceConfig(dtype="bfloat16").fp32_master_bytes("float32") == 4
    assert EMAReferenceConfig().fp32_master_bytes("float32") == 0
    assert PeriodicResetReferenceConfig().fp32_master_bytes("bfloat16") == 0


def test_the_master_resumes_the_blend_exactly():
    """A checkpoint holds the master: a reference restored from it continues bit for bit."""
    policy = _model(1, "float32")
    a = build_reference(EMAReferenceConfig(alpha=ALPHA), lambda: _model(0, "bfloat16"))
    for step in (1, 2, 3):
        a.after_step(step, policy, {})
    sd = a.state_dict()
    assert set(sd["master"]) == set(a.master)
    b = build_reference(EMAReferenceConfig(alpha=ALPHA), lambda: _model(0, "bfloat16"))
    b.load_state_dict(sd)
    for s in (a, b):
        s.after_step(4, policy, {})
    for n, t in a.master.items():
        assert torch.equal(t, b.master[n]), n
    wa, wb = _weights(a.model), _weights(b.model)
    assert all(torch.equal(wa[n], wb[n]) for n in wa)
