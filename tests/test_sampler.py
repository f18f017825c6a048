"""Rollouts: behaviour log-probs equal the trainer's recomputation; randomness is keyed, not batched."""

from __future__ import annotations

import pytest
import torch

from refexp import titan
from refexp.components import sampler
from refexp.config import ModelConfig
from refexp.tasks.tokenizer import build_char_tokenizer
from tests.helpers.compile_count import CountingBackend

pytestmark = pytest.mark.numerics  # tests/README.md: run under other CPU kernels too

TOK = build_char_tokenizer()
PROMPTS = ["12+34=", "5+6=", "123+456=", "7="]  # different lengths: left padding in the decoder


def _model(seed=0):
    titan.prepare_torchtitan("cpu")
    cfg = ModelConfig(dim=32, n_layers=2, n_heads=2, n_kv_heads=2, ffn_hidden_dim=64, max_seq_len=64)
    return titan.build_model(cfg, vocab_size=TOK.vocab_size, device="cpu", seed=seed, requires_grad=False)


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_behaviour_logprobs_equal_the_trainers_recomputation(temperature, top_p):
    m = _model()
    keys = [(0, 1, i, 0) for i in range(len(PROMPTS))]
    r = sampler.generate(m, TOK, PROMPTS, max_new_tokens=12, temperature=temperature, top_p=top_p, keys=keys)
    logp = titan.token_logprobs(m, r.tokens_BT, temperature=temperature)
    assert r.mask_BT.any()
    torch.testing.assert_close(r.behaviour_logp[r.mask_BT], logp[r.mask_BT], rtol=0, atol=1e-4)
    assert (r.behaviour_logp[~r.mask_BT] == 0).all()
    # the training layout: each row is [prompt, completion, pad...] with the prompt unpadded
    for i, p in enumerate(PROMPTS):
        n = len(TOK.encode(p, add_bos=True))
        assert TOK.decode(r.tokens_BT[i, :n].tolist()) == p
        assert r.mask_BT[i, n - 1] and not r.mask_BT[i, : n - 1].any()


def test_samples_depend_on_the_key_not_on_the_batch():
    m = _model()
    keys = [(3, 7, i, g) for i in range(len(PROMPTS)) for g in range(2)]
    prompts = [p for p in PROMPTS for _ in range(2)]
    batch = sampler.generate(m, TOK, prompts, max_new_tokens=10, keys=keys)
    for j in (0, 5, 7):  # the same row sampled alone, or in another batch, is the same completion
        alone = sampler.generate(m, TOK, [prompts[j]], max_new_tokens=10, keys=[keys[j]])
        assert alone.completion_ids[0] == batch.completion_ids[j]
    other = sampler.generate(m, TOK, prompts, max_new_tokens=10, keys=[(4, *k[1:]) for k in keys])
    assert other.completion_ids != batch.completion_ids  # another seed, other samples


def test_greedy_is_the_argmax_continuation():
    m = _model()
    r = sampler.generate(m, TOK, PROMPTS[:2], max_new_tokens=5, greedy=True)
    for i, p in enumerate(PROMPTS[:2]):
        ids = TOK.encode(p, add_bos=True)
        for tok in r.completion_ids[i]:
            nxt = titan.logits(m, torch.tensor([ids]))[0, -1].argmax().item()
            assert tok == nxt
            ids.append(tok)
            if tok == TOK.eos_id:
                break


def test_inverse_cdf_sampling_follows_the_distribution():
    probs = torch.tensor([[0.1, 0.6, 0.3]]).repeat(20000, 1)
    u = sampler.row_uniforms([(i,) for i in range(20000)], 1)[:, 0]
    counts = torch.bincount(sampler._inverse_cdf(probs, u), minlength=3).float() / 20000
    torch.testing.assert_close(counts, torch.tensor([0.1, 0.6, 0.3]), rtol=0, atol=0.015)
    kept = sampler._top_p_filter(torch.tensor([[0.1, 0.6, 0.3]]), 0.8)
    torch.testing.assert_close(kept, torch.tensor([[0.0, 0.6, 0.3]]))  # the token crossing top_p stays


@pytest.mark.parametrize("every", [3, 8, 100])
def test_checking_for_stopped_rows_less_often_gives_the_same_completions(every):
    """rollout.stop_check_every: rows that stopped emit masked padding until the next check (the log-probs
    to float rounding: the rows dropped at each check change the decode GEMMs' row count)."""
    m = _model()
    keys = [(1, 2, i, 0) for i in range(len(PROMPTS))]
    ref = sampler.generate(m, TOK, PROMPTS, max_new_tokens=12, keys=keys)
    r = sampler.generate(m, TOK, PROMPTS, max_new_tokens=12, keys=keys, stop_check_every=every)
    assert r.completion_ids == ref.completion_ids and r.texts == ref.texts
    assert torch.equal(r.tokens_BT, ref.tokens_BT) and torch.equal(r.mask_BT, ref.mask_BT)
    torch.testing.assert_close(r.behaviour_logp, ref.behaviour_logp, rtol=0, atol=1e-5)


class _StopAt:
    """The char tokenizer with other stop ids (so that rows of a random model finish at different steps)."""

    def __init__(self, tok, stop_ids):
        self._tok, self.stop_ids = tok, tuple(stop_ids)

    def __getattr__(self, name):
        return getattr(self._tok, name)


def test_finished_rows_leave_the_decode_batch_and_the_completions_stay_the_same(monkeypatch):
    m = _model()
    prompts = [p for p in PROMPTS for _ in range(4)]
    keys = [(3, 1, i, 0) for i in range(len(prompts))]
    free = sampler.generate(m, _StopAt(TOK, [10**6]), prompts, max_new_tokens=12, keys=keys)  # no stop id
    stop = free.completion_ids[0][2]  # a token row 0 samples at its third step: rows end at different steps
    tok = _StopAt(TOK, [stop])
    batch_sizes, decode_step = [], titan.decode_step
    monkeypatch.setattr(titan, "decode_step",
                        lambda model, t, st: (batch_sizes.append(len(t)), decode_step(model, t, st))[1])
    dropped = sampler.generate(m, tok, prompts, max_new_tokens=12, keys=keys)
    monkeypatch.setattr(sampler, "DROP_FINISHED_SHARE", 2.0)  # never drop
    kept = sampler.generate(m, tok, prompts, max_new_tokens=12, keys=keys)
    lengths = [len(c) for c in kept.completion_ids]
    assert len(set(lengths)) > 2 and min(lengths) < 12  # rows did finish, at different steps
    n_steps = max(lengths) - 1
    sizes_dropping, sizes_kept = batch_sizes[:n_steps], batch_sizes[n_steps:]
    assert sizes_kept == [len(prompts)] * n_steps
    assert sizes_dropping[0] <= len(prompts) and sizes_dropping[-1] < len(prompts)
    assert all(a >= b for a, b in zip(sizes_dropping, sizes_dropping[1:]))  # the batch only shrinks
    assert dropped.completion_ids == kept.completion_ids and torch.equal(dropped.mask_BT, kept.mask_BT)
    torch.testing.assert_close(dropped.behaviour_logp, kept.behaviour_logp, rtol=0, atol=1e-5)


@pytest.fixture
def counted_static_step(monkeypatch):
    """rollout.static_decode's step compiled on CPU with a counting backend, from no kept buckets."""
    from refexp.titan import static_decode

    backend = CountingBackend()
    titan.release_static_buckets()
    monkeypatch.setattr(static_decode, "CPU_BACKEND", backend)
    yield backend
    titan.release_static_buckets()


def test_fixed_shape_decoding_gives_the_same_completions_and_compiles_once_per_bucket(counted_static_step):
    """rollout.static_decode: the same tokens as the default decode (log-probs to float rounding: attention
    reads every slot under a mask) whatever the padding, the step traces as one graph (fullgraph: CUDA-graph
    capture needs it), and batches of other row counts (padded to a power of two) and prompt lengths (a fixed
    capacity) reuse the bucket's compiled step and buffers; stale keys of an earlier batch do not leak in."""
    m = _model()
    before = titan.static_decode_stats()
    batches = [[p for p in PROMPTS for _ in range(2)],            # 8 rows: bucket 8, prompts of 4 lengths
               [PROMPTS[3], PROMPTS[1], PROMPTS[1]],              # 3 rows, shorter prompts: bucket 8 again
               [p for p in reversed(PROMPTS) for _ in range(3)]]  # 12 rows: bucket 16
    for i, prompts in enumerate(batches):
        keys = [(5, i, j, 0) for j in range(len(prompts))]
        ref = sampler.generate(m, TOK, prompts, max_new_tokens=10, keys=keys)
        static = sampler.generate(m, TOK, prompts, max_new_tokens=10, keys=keys, static_decode=True,
                                  static_capacity=32)
        assert static.completion_ids == ref.completion_ids and torch.equal(static.mask_BT, ref.mask_BT)
        torch.testing.assert_close(static.behaviour_logp, ref.behaviour_logp, rtol=0, atol=1e-5)
    assert counted_static_step.graphs == 2  # buckets 8 and 16, each compiled once
    after = titan.static_decode_stats()
    assert after["compiles"] - before["compiles"] == 2 and after["buckets"] - before["buckets"] == 2


def test_a_fixed_capacity_too_small_for_the_prompts_and_budget_is_refused(counted_static_step):
    m = _model()
    with pytest.raises(ValueError, match=r"capacity=12 slots is invalid .* expected at least 19"):
        sampler.generate(m, TOK, PROMPTS, max_new_tokens=10, keys=[(0, 0, i) for i in range(4)], static_decode=True,
                         static_capacity=12)
    # the refusal left no bucket held: the next generation runs
    sampler.generate(m, TOK, PROMPTS, max_new_tokens=10, keys=[(0, 0, i) for i in range(4)], static_decode=True,
                     static_capacity=19)
