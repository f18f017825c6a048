"""Memory controls change memory, not numbers: activation checkpointing, chunked log-probs, micro-batching
(``training.micro_batch_size``) and ``reference.offload`` give the plain step's losses and gradients.

Gradients are compared where the step hands them to the optimizer (``optimizer_step`` wrapped to
record every parameter's gradient, by canonical name), so a difference cannot hide in a metric.
Two-process micro-batching is in tests/test_mixed_precision.py (one torchrun launch for both files' needs).
"""

from __future__ import annotations

import pytest
import torch

from refexp import titan
from refexp.config import ActivationCheckpointConfig, ConfigError
from refexp.record.metrics import read_metrics
from refexp.run import run, validate
from refexp.titan import logprobs as titan_logprobs
from refexp.titan.unwrap import canonical_name
from tests.helpers.configs import TINY_GRPO_OVERRIDES, compose_tiny_run
from tests.helpers.models import tiny_model_config
from tests.helpers.runs import SAME_METRICS_TOL, assert_same_row

pytestmark = pytest.mark.numerics  # tests/README.md: run under other CPU kernels too

TOL = SAME_METRICS_TOL
V = 15
DPO = ["algo=dpo", "algo.num_pairs=32", "algo.pairs_per_step=8", "training.steps=2"]
MODEL = tiny_model_config(vocab_size=V, n_layers=3)


def loss_and_grads(model, tokens) -> tuple[float, dict[str, torch.Tensor]]:
    lp = titan.token_logprobs(model, tokens, temperature=0.7)
    loss = -lp.mean()
    loss.backward()
    return loss.item(), {canonical_name(n): p.grad.clone() for n, p in model.named_parameters()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


# ---------------------------------------------------------------- activation checkpointing, one model
@pytest.mark.parametrize("mode,option", [("full", "op"), ("selective", "op"), ("selective", "2")])
def test_activation_checkpointing_gives_the_plain_loss_and_gradients(mode, option):
    tokens = torch.randint(0, V, (4, 16), generator=torch.Generator().manual_seed(0))
    plain = titan.build_model(MODEL, vocab_size=V, device="cpu")
    ac = titan.build_model(MODEL, vocab_size=V, device="cpu",
                           ac_cfg=ActivationCheckpointConfig(mode=mode, selective_ac_option=option))
    wrapped = [n for n, _ in ac.named_modules() if n.endswith("_checkpoint_wrapped_module")]
    # every block, or every 2nd block (block 1 of 0..2)
    assert len(wrapped) == (1 if option == "2" else 3), wrapped
    loss0, g0 = loss_and_grads(plain, tokens)
    loss1, g1 = loss_and_grads(ac, tokens)
    assert abs(loss0 - loss1) <= TOL and max_diff(g0, g1) <= TOL


def test_frozen_models_are_never_checkpointed():
    frozen = titan.build_model(MODEL, vocab_size=V, device="cpu", requires_grad=False,
                               ac_cfg=ActivationCheckpointConfig(mode="full"))
    assert not any(n.endswith("_checkpoint_wrapped_module") for n, _ in frozen.named_modules())


# ---------------------------------------------------------------- chunked log-probs
def test_chunked_logprobs_equal_the_whole_batch_and_entropy_has_no_gradient(monkeypatch):
    model = titan.build_model(MODEL, vocab_size=V, device="cpu")
    tokens = torch.randint(0, V, (5, 12), generator=torch.Generator().manual_seed(1))
    lp0, ent0 = titan.token_logprobs(model, tokens, temperature=0.7, with_entropy=True)
    lp0.sum().backward()
    g0 = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    monkeypatch.setattr(titan_logprobs, "FP32_CHUNK_ELEMENTS", 2 * 11 * V)  # 2 rows a chunk: 3 chunks
    lp1, ent1 = titan.token_logprobs(model, tokens, temperature=0.7, with_entropy=True)
    lp1.sum().backward()
    g1 = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert not ent0.requires_grad and not ent1.requires_grad
    assert float((lp0 - lp1).abs().max()) <= TOL and float((ent0 - ent1).abs().max()) <= TOL
    assert max_diff(g0, g1) <= TOL


# ---------------------------------------------------------------- micro-batching through the real step
@pytest.fixture
def recorded_grads(monkeypatch):
    """Every optimizer step's gradients, by canonical parameter name, as the steps hand them over."""
    import refexp.algos.dpo as dpo_mod
    import refexp.algos.grpo as grpo_mod

    steps: list[dict[str, torch.Tensor]] = []
    original = grpo_mod.optimizer_step

    def record(ctx, policy, loss, step, ckpt):
        steps.append({canonical_name(n): p.grad.detach().clone() for n, p in policy.model.named_parameters()})
        return original(ctx, policy, loss, step, ckpt)

    monkeypatch.setattr(grpo_mod, "optimizer_step", record)
    monkeypatch.setattr(dpo_mod, "optimizer_step", record)
    return steps


def run_recording(tmp_path, name: str, recorded: list, *overrides: str) -> tuple[dict[int, dict], list]:
    start = len(recorded)
    run(compose_tiny_run(tmp_path / name, *overrides))
    rows = {r["step"]: r for r in read_metrics(tmp_path / name)}
    return rows, recorded[start:]


def assert_same_steps(got: tuple, want: tuple) -> None:
    (rows_g, grads_g), (rows_w, grads_w) = got, want
    assert len(grads_g) == len(grads_w) > 0
    for i, (g, w) in enumerate(zip(grads_g, grads_w)):
        assert max_diff(g, w) <= TOL, f"update {i}: gradients differ by {max_diff(g, w):.3g}"
    assert rows_g.keys() == rows_w.keys()
    for step in rows_w:  # chunks and checkpointing sum in another order: thresholded counts may tie apart
        assert_same_row(rows_g[step], rows_w[step], other_order=True, tol=TOL, where=f"step {step}")


GRPO_SHORT = [*TINY_GRPO_OVERRIDES, "training.steps=2", "reference=ema", "reference.alpha=0.5", "algo.beta=0.1"]


@pytest.mark.parametrize("loss_agg,share_prompt,micro", [
    ("grpo", "true", 4), ("dr_grpo", "true", 8), ("dapo", "true", 4), ("grpo", "false", 3), ("dapo", "false", 5),
])
def test_grpo_micro_batches_give_the_whole_step(tmp_path, dense_reward, recorded_grads, loss_agg, share_prompt,
                                                micro):
    """16 completions a step in chunks of ``micro`` (an uneven last chunk without prompt sharing), plus
    full activation checkpointing on one of them: every update's gradients and every metric as the plain step."""
    base = [*GRPO_SHORT, f"algo.loss_agg={loss_agg}", f"algo.share_prompt={share_prompt}"]
    want = run_recording(tmp_path, "plain", recorded_grads, *base)
    extra = ["activation_checkpoint=full"] if micro == 4 else []
    got = run_recording(tmp_path, "micro", recorded_grads, *base, f"training.micro_batch_size={micro}", *extra)
    assert_same_steps(got, want)


@pytest.mark.parametrize("loss_type", ["sigmoid", "orpo"])
def test_dpo_micro_batches_give_the_whole_step(tmp_path, recorded_grads, loss_type):
    """8 pairs a step in chunks of 3 (3 + 3 + 2); ORPO's token-mean NLL term included."""
    ref = "reference=none" if loss_type == "orpo" else "reference=ema"
    base = [*DPO, ref, f"algo.loss_type={loss_type}"]
    want = run_recording(tmp_path, "plain", recorded_grads, *base)
    got = run_recording(tmp_path, "micro", recorded_grads, *base, "training.micro_batch_size=3")
    assert_same_steps(got, want)


def test_micro_batch_must_hold_whole_groups_when_prompts_are_shared(tmp_path):
    with pytest.raises(ConfigError, match=r"training.micro_batch_size=6 .*multiple of algo.group_size=4"):
        validate(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, "algo.share_prompt=true",
                                  "training.micro_batch_size=6"))
    validate(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, "algo.share_prompt=false", "training.micro_batch_size=6"))


# ---------------------------------------------------------------- reference.offload and the kl/init anchor
def test_offload_gives_the_same_run_and_the_anchor_is_built_once(tmp_path, dense_reward, monkeypatch):
    """reference.offload=true logs what offload=false logs (on CPU the host is the device); the kl/init
    anchor is built from disk once per run, not at each of the 3 evaluations (steps 0, 2, 4)."""
    import refexp.algos.loop as loop_mod

    builds: list[str] = []
    original = loop_mod.build_frozen

    def counting(ctx, path, **kwargs):
        builds.append(str(ctx.run_dir))
        return original(ctx, path, **kwargs)

    monkeypatch.setattr(loop_mod, "build_frozen", counting)
    base = [*TINY_GRPO_OVERRIDES, "reference=ema", "reference.alpha=0.5", "algo.beta=0.1"]
    run(compose_tiny_run(tmp_path / "resident", *base))
    run(compose_tiny_run(tmp_path / "offload", *base, "reference.offload=true"))
    # one reference and one anchor per run
    assert builds.count(str(tmp_path / "resident")) == 2 and builds.count(str(tmp_path / "offload")) == 2
    want = {r["step"]: r for r in read_metrics(tmp_path / "resident")}
    got = {r["step"]: r for r in read_metrics(tmp_path / "offload")}
    for step, w in want.items():
        assert {k: v for k, v in got[step].items() if not k.startswith(("perf/", "mem/"))} == \
               {k: v for k, v in w.items() if not k.startswith(("perf/", "mem/"))}, step


def test_offloaded_anchor_is_built_once_and_lent_to_the_device_per_measurement(monkeypatch):
    """The kl/init anchor offloads as the reference does (its moves per step: tests/test_offload.py): built once,
    parked on the host, lent to the device for each measurement (the meta device here: a move there is real,
    a copy back from it impossible) and back on its host tensors after it."""
    import refexp.reference.offload as offload
    from refexp.reference.anchor import InitAnchor

    meta = torch.device("meta")
    moved: list[torch.device] = []
    real = offload.copy_to_device
    monkeypatch.setattr(offload, "copy_to_device", lambda t, device: moved.append(device) or real(t, device))
    monkeypatch.setattr(offload, "model_device", lambda model: meta)
    built: list[torch.nn.Module] = []

    def build():
        titan.prepare_torchtitan("cpu")
        built.append(titan.build_model(tiny_model_config(), vocab_size=17, device="cpu", requires_grad=False))
        return built[-1]

    anchor = InitAnchor(build, offload=True)
    for _ in range(3):
        with anchor.logprobs():
            assert all(t.device == meta for t in [*built[0].parameters(), *built[0].buffers()])
        assert all(t.device.type == "cpu" for t in [*built[0].parameters(), *built[0].buffers()])
    n = len([*built[0].parameters(), *built[0].buffers()])
    assert len(built) == 1 and moved == [meta] * (3 * n)
