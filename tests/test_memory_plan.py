"""The memory plan's phases against what the code allocates: a toy GRPO layout on CPU with bf16 compute
(so the policy is FSDP-wrapped, as on GPUs), its rollout and policy-training phases run through the same
functions a run calls, every live tensor's bytes counted by torch's ``MemTracker`` (a dispatch mode that
sees each storage the code allocates and frees, FSDP's included)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.fsdp import FSDPModule

from refexp import titan
from refexp.cli import memory_plan, memory_rows
from refexp.cli.dry_run import fill_data_paths
from refexp.components.sampler import DROP_FINISHED_SHARE, _Sampling
from refexp.config import to_object
from refexp.titan.unwrap import reshard_fsdp
from tests.helpers.configs import compose_root

TOY = ["algo=grpo", "model=tiny", "model.dim=128", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2",
       "model.ffn_hidden_dim=512", "model.vocab_size=4096", "model.max_seq_len=128", "training.device=cpu",
       "training.mixed_precision_param=bfloat16", "algo.prompts_per_step=4", "algo.group_size=4",
       "algo.share_prompt=false", "task.max_prompt_len=24", "task.max_new_tokens=40", "eval.num_prompts=4",
       "eval.kl_prompts=4", "training.micro_batch_size=8", "logger=none"]
TOLERANCE = 0.05
"""A phase's measured bytes on top of the resident state are within 5% of the plan's: what the plan leaves
out (a layer's transient intermediates, FSDP's all-gather buffers) stays below that here, and every line it
counts is more than that at this size (dropping any one of them fails a test)."""


def _tracked(objects, run) -> tuple[int, int]:
    """(bytes live when ``run`` starts, peak bytes above that while it runs), over every CPU tensor."""
    mt = MemTracker()
    mt.track_external(*objects)
    with mt:
        start = mt.get_tracker_snapshot("current")[torch.device("cpu")]["Total"]  # the peak starts here too
        run()
    peak = mt.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    return start, peak - start


@pytest.fixture(scope="module")
def toy():
    cfg = to_object(fill_data_paths(compose_root(*TOY)))
    torch.manual_seed(0)
    policy = titan.build_model(cfg.model, vocab_size=None, device="cpu", training_cfg=cfg.training,
                               ac_cfg=cfg.activation_checkpoint)
    reference = titan.build_model(cfg.model, vocab_size=None, device="cpu", training_cfg=cfg.training,
                                  requires_grad=False)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    tokens = torch.randint(1, 4000, (2, 8))
    titan.token_logprobs(policy, tokens).mean().backward()
    opt.step()
    opt.zero_grad()  # what clip_and_step leaves between steps: moments allocated, no gradients
    return cfg, memory_plan.plan(cfg), (policy, reference, opt)


def _on_top(plan, phase: str) -> float:
    return sum(i.bytes for i in plan.phases[phase])


def test_the_toy_plan_is_the_layout_measured_below(toy):
    cfg, plan, _ = toy
    assert "FSDP" in type(toy[2][0]).__name__  # bf16 compute: wrapped at one rank, as on GPUs
    assert plan.phases["rollout"][0].bytes > 0 and plan.phases["rollout"][1].bytes > 0
    gen = max(memory_rows.generations(cfg, 1), key=lambda g: g.rows * g.length)
    assert (gen.rows, gen.length, gen.distinct) == (16, 64, 4)


def test_the_rollout_phase_holds_what_the_plan_counts(toy):
    """GRPO's rollout as ``sampler.generate`` runs it: the distinct prompts prefilled, the cache repeated for
    each group, tokens drawn by the sampler's own step, finished rows dropped (the most the sampler's share
    allows), then decoded to the end."""
    cfg, plan, (policy, reference, opt) = toy
    U, G, L, N = 4, 4, cfg.task.max_prompt_len, cfg.task.max_new_tokens
    prompts = torch.randint(1, 4000, (U, L))
    sampling = _Sampling(greedy=False, temperature=1.0, top_p=1.0, u_BT=torch.rand(U * G, N))

    def rollout():
        logits, state = titan.prefill(policy, prompts, torch.full((U,), L), max_new_tokens=N)
        state = titan.repeat_decode_rows(state, torch.arange(U).repeat_interleave(G))
        logits = logits.repeat_interleave(G, 0)
        for t in range(N - 1):
            tok = sampling.next_tokens(logits, slice(0, len(logits)), t)[0]
            if t == 2:  # the first stop check that may drop rows: all but the share that stopped
                keep = U * G - math.ceil(DROP_FINISHED_SHARE * U * G)
                state = titan.repeat_decode_rows(state, torch.arange(keep))
                tok = tok[:keep]
            logits, state = titan.decode_step(policy, tok, state)
        titan.finish_decode(state)

    start, above = _tracked((policy, reference, opt), rollout)
    resident = sum(i.bytes for i in plan.resident)
    assert start == pytest.approx(resident, rel=0.02)
    assert above == pytest.approx(_on_top(plan, "rollout"), rel=TOLERANCE)


@pytest.mark.parametrize("rows, length", [(8, 64), (1, 16)], ids=["the toy's chunk", "a short chunk"])
def test_the_policy_training_phase_holds_what_the_plan_counts(toy, rows, length):
    """One chunk's forward and backward, the output layer at the completion tokens only (``select_BT``, as the
    GRPO step asks); the short chunk is mostly what does not scale with tokens (gradients, unsharded blocks, the
    lm_head unit)."""
    cfg, plan, (policy, reference, opt) = toy
    if (rows, length) != (8, cfg.task.max_prompt_len + cfg.task.max_new_tokens):
        cfg = to_object(fill_data_paths(compose_root(*TOY, f"training.micro_batch_size={rows}",
                                                     "task.max_prompt_len=8", "task.max_new_tokens=8")))
        plan = memory_plan.plan(cfg)
    tokens = torch.randint(1, 4000, (rows, length))
    completion = torch.zeros(rows, length - 1, dtype=torch.bool)
    completion[:, cfg.task.max_prompt_len - 1:] = True  # logp[:, t] scores token t+1: the completion's, as GRPO reads

    def train_chunk():
        titan.token_logprobs(policy, tokens, select_BT=completion).mean().backward()

    start, above = _tracked((policy, reference, opt), train_chunk)
    opt.zero_grad()
    assert above == pytest.approx(_on_top(plan, "policy training"), rel=TOLERANCE)


def _named(items, name: str):
    return next(i for i in items if i.what == name)


def test_the_plan_asks_the_trainers_own_decisions(monkeypatch):
    """Whether the reference is live, whether the kl/init anchor is the reference, and the evaluation's batch are
    the functions the trainer asks (refexp/reference/, refexp/components/evaluation.py): change one, the plan
    follows."""
    from refexp.components import evaluation
    from refexp.reference import anchor, strategies

    cfg = to_object(fill_data_paths(compose_root(*TOY, "reference=fixed")))
    plan = memory_plan.plan(cfg)
    assert _named(plan.resident, "reference").bytes > 0
    assert _named(plan.resident, "kl/init anchor").how == "the fixed reference itself"
    assert _named(plan.phases["reference forward"], "reference logits").bytes > 0

    with monkeypatch.context() as mp:
        mp.setattr(strategies, "reference_source", lambda cfg: "none")
        plan = memory_plan.plan(cfg)
    assert _named(plan.resident, "reference").bytes == 0
    assert _named(plan.phases["reference forward"], "reference logits").bytes == 0
    assert _named(plan.resident, "kl/init anchor").how == "frozen copy"  # no reference to share

    with monkeypatch.context() as mp:
        mp.setattr(anchor, "anchor_is_reference", lambda cfg, ref_path, init_path: False)
        plan = memory_plan.plan(cfg)
    assert _named(plan.resident, "reference").bytes > 0 and _named(plan.resident, "kl/init anchor").how == "frozen copy"

    assert {g.rows for g in memory_rows.generations(cfg, 1) if g.what != "the GRPO step's"} == {4}
    monkeypatch.setattr(evaluation, "EVAL_BATCH_SIZE", 3)
    assert {g.rows for g in memory_rows.generations(cfg, 1) if g.what != "the GRPO step's"} == {3}


@pytest.mark.parametrize("chunk", [None, 16], ids=["every position in one chunk", "16 positions a chunk"])
def test_the_drift_measurement_phase_holds_what_the_plan_counts(toy, monkeypatch, chunk):
    """``kl/init_exact`` on the largest drift batch as ``evaluation.kl_to_anchor`` runs it (``titan.token_kl`` at the
    completion tokens): both forwards, both output layers' whole weights and hidden states, one chunk's log-softmaxes
    (all 160 positions at once; or 16 at a time, when the anchor's forward outweighs a chunk: the KL never holds
    more than its chunk)."""
    from refexp.titan import exact_kl, logprobs

    cfg, plan, (policy, reference, opt) = toy
    if chunk is not None:
        for module in (exact_kl, logprobs):
            monkeypatch.setattr(module, "FP32_CHUNK_ELEMENTS", chunk * cfg.model.vocab_size)
        plan = memory_plan.plan(cfg)
    g = memory_rows.drift_generation(cfg, 1)
    tokens = torch.randint(1, 4000, (g.rows, g.length))
    completion = torch.zeros(g.rows, g.length - 1, dtype=torch.bool)
    completion[:, cfg.task.max_prompt_len - 1:] = True
    # the anchor stands in trainable (the tracker hooks the gradients of the modules it sees run, which a frozen
    # one has none of), resharded after its forward as a frozen model is (refexp/titan/build.py)
    anchor = titan.build_model(cfg.model, vocab_size=None, device="cpu", training_cfg=cfg.training)
    for m in anchor.modules():
        if isinstance(m, FSDPModule):
            m.set_reshard_after_forward(True, recurse=False)
    reshard_fsdp(policy)  # as after a training step: the measurement's own forward unsharding its last unit counts
    start, above = _tracked((policy, reference, opt, anchor), lambda: titan.token_kl(policy, anchor, tokens,
                                                                                      select_BT=completion))
    assert above == pytest.approx(_on_top(plan, "drift measurement"), rel=TOLERANCE)


def test_several_drift_samples_per_prompt_decode_as_many_rows_of_fewer_prompts():
    """``eval.kl_samples`` completions per prompt: ``kl_to_anchor`` takes ``EVAL_BATCH_SIZE // kl_samples`` prompts a
    batch, so the plan's drift batch keeps its rows and holds fewer distinct prompts (their KV cache repeated)."""
    one = memory_rows.drift_generation(to_object(fill_data_paths(compose_root(*TOY, "eval.kl_prompts=300"))), 1)
    four = memory_rows.drift_generation(to_object(fill_data_paths(compose_root(*TOY, "eval.kl_prompts=300",
                                                                                "eval.kl_samples=4"))), 1)
    assert (one.rows, one.distinct) == (256, 256) and (four.rows, four.distinct) == (256, 64)
