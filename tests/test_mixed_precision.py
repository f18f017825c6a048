"""bf16 compute with float32 master weights (FSDP2's MixedPrecisionPolicy) at every world size, on CPU the
same code path as on GPU; and micro-batching with activation checkpointing on two processes.

One process with ``training.mixed_precision_param=bfloat16`` shards over a 1-rank mesh
(refexp/titan/build.py, docs/torchtitan-notes.md §12); float32, the CPU default, keeps the plain module.
The 2-process checks are two torchrun launches (TINY_GRPO_OVERRIDES, DPO), each a ``-m`` sweep of
{bfloat16, float32} x micro-batches x full activation checkpointing: the float32 job must match the plain
single-process run on every continuous metric within SAME_METRICS_TOL (tests/helpers/runs.py: thresholded counts
may tie apart in another summation order), the bf16 job must finish with finite metrics that differ from float32's.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributed.fsdp import FSDPModule

from refexp import titan
from refexp.config import ActivationCheckpointConfig, TrainingConfig
from refexp.record.metrics import read_metrics
from refexp.run import run
from refexp.titan import logprobs as titan_logprobs
from tests.helpers.configs import (
    SMALL_DPO_OVERRIDES,
    SMALL_GRPO_OVERRIDES,
    SMALL_RUN_OVERRIDES,
    TINY_GRPO_OVERRIDES,
    compose_small_run,
    compose_tiny_run,
)
from tests.helpers.models import tiny_model_config
from tests.helpers.runs import assert_same_metrics, run_status, torchrun

pytestmark = pytest.mark.numerics  # tests/README.md: run under other CPU kernels too

V = 15
BF16 = TrainingConfig(mixed_precision_param="bfloat16")
MODEL = tiny_model_config(vocab_size=V)


def tokens() -> torch.Tensor:
    return torch.randint(0, V, (4, 12), generator=torch.Generator().manual_seed(0))


# ---------------------------------------------------------------- the model, one process
def test_float32_on_cpu_stays_a_plain_module():
    assert TrainingConfig().compute_dtype("cpu") == "float32"
    assert TrainingConfig().compute_dtype("cuda") == "bfloat16"
    model = titan.build_model(MODEL, vocab_size=V, device="cpu")
    assert not any(isinstance(m, FSDPModule) for m in model.modules())


def test_bf16_one_process_computes_in_bf16_with_float32_master_weights_and_gradients():
    model = titan.build_model(MODEL, vocab_size=V, device="cpu", training_cfg=BF16,
                              ac_cfg=ActivationCheckpointConfig(mode="full"))
    assert isinstance(model, FSDPModule)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the optimizer's master copy
    assert titan_logprobs._forward(model, tokens()).dtype == torch.bfloat16
    lp = titan.token_logprobs(model, tokens())
    assert lp.dtype == torch.float32  # the log-softmax runs in float32 on the bf16 logits
    lp.mean().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())
    plain = titan.build_model(MODEL, vocab_size=V, device="cpu")
    diff = float((titan.token_logprobs(plain, tokens()) - lp).detach().abs().max())
    assert 1e-5 < diff < 0.1  # bf16 rounding, not another model


def test_bf16_frozen_copy_of_the_same_weights_gives_kl_exactly_zero():
    """The reference computes in the policy's dtype, so at policy == reference the KL is exactly 0."""
    policy = titan.build_model(MODEL, vocab_size=V, device="cpu", training_cfg=BF16)
    frozen = titan.build_model(MODEL, vocab_size=V, device="cpu", training_cfg=BF16, requires_grad=False)
    with torch.inference_mode():
        ref = titan.token_logprobs(frozen, tokens())
    assert torch.equal(titan.token_logprobs(policy, tokens()).detach(), ref)


# ---------------------------------------------------------------- end to end, one process
@pytest.fixture
def forward_dtypes(monkeypatch):
    """The dtype of every model forward's logits during a run: the full logits', or, where only selected
    positions go through the output layer (``select_BT``), the final hidden states' it takes (its output's)."""
    seen: set[torch.dtype] = set()
    original, selected = titan_logprobs._forward, titan_logprobs._selected_logprobs

    def recording(*args, **kwargs):
        out = original(*args, **kwargs)
        if out.dim() == 3:  # [B, T, V] logits, not the selection's log-probs [K]
            seen.add(out.dtype)
        return out

    def recording_selected(h_BTD, *args, **kwargs):
        seen.add(h_BTD.dtype)
        return selected(h_BTD, *args, **kwargs)

    monkeypatch.setattr(titan_logprobs, "_forward", recording)
    monkeypatch.setattr(titan_logprobs, "_selected_logprobs", recording_selected)
    return seen


def assert_finite_run(run_dir, steps: int) -> list[dict]:
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(steps + 1))
    for r in rows:
        bad = {k: v for k, v in r.items() if isinstance(v, float) and not math.isfinite(v)}
        assert not bad, (r["step"], bad)
    return rows


def test_grpo_bf16_one_process(tmp_path, dense_reward, forward_dtypes):
    run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, "training.steps=2", "reference=fixed", "algo.beta=0.1",
                    "training.mixed_precision_param=bfloat16", "training.micro_batch_size=8",
                    "activation_checkpoint=selective"))
    rows = assert_finite_run(tmp_path, 2)
    assert forward_dtypes == {torch.bfloat16}
    assert rows[0]["kl/init"] == 0.0  # the anchor computes in bf16 too
    assert rows[1]["loss/kl"] == 0.0  # step 1: policy == the fixed reference, exactly


def test_dpo_bf16_one_process(tmp_path, forward_dtypes):
    run(compose_tiny_run(tmp_path, "algo=dpo", "algo.num_pairs=32", "algo.pairs_per_step=8", "training.steps=2",
                    "reference=ema", "training.mixed_precision_param=bfloat16", "training.micro_batch_size=4"))
    rows = assert_finite_run(tmp_path, 2)
    assert forward_dtypes == {torch.bfloat16}
    assert rows[0]["kl/init"] == 0.0 and rows[0]["kl/ref"] == 0.0


def test_dpo_reference_cache_is_keyed_by_the_compute_dtype(tmp_path):
    """A fixed reference's precomputed log-probs from float32 compute are not reused under bf16 compute."""
    base = ["algo=dpo", "algo.num_pairs=32", "algo.pairs_per_step=8", "training.steps=1", "reference=fixed",
            "algo.precompute_ref=true"]
    built = {}
    for dtype in ("float32", "bfloat16", "bfloat16"):
        name = f"{dtype}-{len(built)}"
        run(compose_tiny_run(tmp_path / name, *base, f"training.mixed_precision_param={dtype}"))
        built[name] = read_metrics(tmp_path / name)[1]["refcache/built"]
    # (the float32 table may come from another test of the session: same key)
    assert (built["bfloat16-1"], built["bfloat16-2"]) == (1.0, 0.0), built


# ---------------------------------------------------------------- two processes
@pytest.fixture(scope="module")
def dist_env(tmp_path_factory):
    """Single-process float32 baselines (plain steps) in this process; the session's cache."""
    base = tmp_path_factory.getbasetemp()
    cache = base / "refexp-cache"
    out = tmp_path_factory.mktemp("mp-single")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REFEXP_CACHE", str(cache))
        run(compose_small_run(out / "grpo", *SMALL_GRPO_OVERRIDES, "reference=ema", "reference.alpha=0.5"))
        run(compose_small_run(out / "dpo", *SMALL_DPO_OVERRIDES, "reference=ema", "reference.alpha=0.5"))
    return {"cache": cache, "single": out, "tmp": tmp_path_factory.mktemp("mp-multi")}


def sweep_two_processes(dist_env, name: str, algo: list[str], micro: int):
    """``torchrun -m`` over {bfloat16, float32} with ``micro``-row chunks and full activation checkpointing."""
    sweep = dist_env["tmp"] / name
    torchrun("-m", *SMALL_RUN_OVERRIDES, *algo, "reference=ema", "reference.alpha=0.5", "parallelism=fsdp",
             "activation_checkpoint=full", f"training.micro_batch_size={micro}",
             "training.mixed_precision_param=bfloat16,float32", f"hydra.sweep.dir={sweep}",
             "hydra.sweep.subdir=${training.mixed_precision_param}", cache=dist_env["cache"])
    return sweep


def check_sweep(sweep, single) -> None:
    for sub in ("bfloat16", "float32"):
        assert run_status(sweep / sub)["status"] == "completed", sub
    assert_same_metrics(sweep / "float32", single, other_order=True)  # micro-batched + checkpointed == plain
    bf16 = assert_finite_run(sweep / "bfloat16", 4)
    fp32 = {r["step"]: r for r in read_metrics(sweep / "float32")}
    assert bf16[0]["kl/init"] == 0.0
    # computed in bf16: the same run, visibly rounded
    assert any(abs(r["kl/init"] - fp32[r["step"]]["kl/init"]) > 1e-7 for r in bf16 if "kl/init" in r)


@pytest.mark.slow
def test_grpo_two_processes_micro_batched_and_bf16(dist_env):
    check_sweep(sweep_two_processes(dist_env, "grpo", SMALL_GRPO_OVERRIDES, 4), dist_env["single"] / "grpo")


@pytest.mark.slow
def test_dpo_two_processes_micro_batched_and_bf16(dist_env):
    check_sweep(sweep_two_processes(dist_env, "dpo", SMALL_DPO_OVERRIDES, 3), dist_env["single"] / "dpo")


@pytest.mark.parametrize("loaded_next", [False, True])
def test_a_model_whose_weights_are_loaded_next_is_allocated_as_shards(loaded_next, monkeypatch):
    """weights_loaded_next: parallelize on the meta device first, so no rank ever holds the whole model;
    otherwise the full model is initialised first (the same weights at any world size)."""
    from torch.distributed.tensor import DTensor

    from refexp.titan import build

    seen = []
    real = build._init_weights_

    def spy(model, *a, **k):
        seen.append(all(isinstance(p, DTensor) for p in model.parameters()))
        return real(model, *a, **k)

    monkeypatch.setattr(build, "_init_weights_", spy)
    # bf16 compute: a 1-rank mesh, the sharded path on one process
    m = titan.build_model(MODEL, vocab_size=V, device="cpu", training_cfg=BF16, weights_loaded_next=loaded_next)
    assert seen == [loaded_next]  # initialised once: as shards, or before sharding
    assert all(isinstance(p, DTensor) and p.device.type == "cpu" for p in m.parameters())
    assert not any(b.is_meta for b in m.buffers())  # the RoPE tables were filled
