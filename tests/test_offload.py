"""``reference.offload`` moves weights: checked with the meta device standing in for the accelerator (a move
there is real, a copy back from it is impossible), so what crosses per step is counted for a fixed and an EMA
reference (refexp/reference/offload.py)."""

from __future__ import annotations

import pytest
import torch

import refexp.reference.offload as offload
from refexp import titan
from refexp.config import EMAReferenceConfig, FixedReferenceConfig, ModelConfig
from refexp.reference.strategies import build_reference

MODEL = ModelConfig(dim=32, n_layers=2, n_heads=2, n_kv_heads=2, ffn_hidden_dim=64, max_seq_len=32)
DEVICE = torch.device("meta")


def _model(seed: int):
    titan.prepare_torchtitan("cpu")
    return titan.build_model(MODEL, vocab_size=17, device=torch.device("cpu"), seed=seed, requires_grad=False)


def _tensors(m) -> list[torch.Tensor]:
    return [*m.parameters(), *m.buffers()]


@pytest.fixture
def moves(monkeypatch):
    """Every host-to-device copy, and every pin (pinning is faked: this machine has no accelerator)."""
    log = {"to_device": 0, "pinned": 0}
    real = offload.copy_to_device

    def to_device(t, device):
        log["to_device"] += 1
        return real(t, device)

    def pin(self):
        log["pinned"] += 1
        return self.clone()

    monkeypatch.setattr(offload, "copy_to_device", to_device)
    monkeypatch.setattr(offload, "pin_host_memory", lambda: True)
    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    return log


def _offloaded(cfg):
    strat = build_reference(cfg, lambda: _model(0))
    strat._device = DEVICE  # where it computes: built on the "accelerator", parked on the host
    return strat


@pytest.mark.parametrize("cfg", [FixedReferenceConfig(offload=True), EMAReferenceConfig(offload=True, alpha=0.5)],
                         ids=["fixed", "ema"])
def test_each_use_copies_to_the_device_once_and_nothing_comes_back(cfg, moves):
    policy = _model(1)
    strat = _offloaded(cfg)
    n = len(_tensors(strat.model))
    assert moves["pinned"] == n  # pinned once, when parked
    host = [t.data_ptr() for t in _tensors(strat.model)]
    for step in range(1, 4):
        before = {k: v.clone() for k, v in strat.model.state_dict().items()}
        moves["to_device"] = 0
        with strat.resident():
            with strat.resident():  # a nested use (a step's micro-batches) does not move it again
                assert all(t.device == DEVICE for t in _tensors(strat.model))
        assert moves["to_device"] == n
        # back on the parked host tensors: no copy from the device (impossible from meta), no new host memory
        assert [t.data_ptr() for t in _tensors(strat.model)] == host
        assert all(torch.equal(v, before[k]) for k, v in strat.model.state_dict().items())
        moved = strat.after_step(step, policy, {})
        assert moves["to_device"] == n  # an update does not take the reference to the device
        assert moved == (cfg.name == "ema")
        changed = any(not torch.equal(v, before[k]) for k, v in strat.model.state_dict().items())
        assert changed == moved  # the EMA wrote its host copy in place
        assert [t.data_ptr() for t in _tensors(strat.model)] == host
    assert moves["pinned"] == n  # never re-pinned


def test_a_nested_update_is_refused():
    """Inside ``resident()`` the model is on the device, and an update there would be lost on the way back."""
    strat = _offloaded(EMAReferenceConfig(offload=True))
    with strat.resident(), pytest.raises(RuntimeError, match="inside resident"):
        strat.after_step(1, _model(1), {})


def test_a_cpu_run_is_not_moved(moves):
    strat = build_reference(FixedReferenceConfig(offload=True), lambda: _model(0))
    with strat.resident():
        pass
    assert moves["to_device"] == 0
