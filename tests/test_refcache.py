"""Reference log-probs of preference pairs: computed once, reused from disk, equal to a live forward,
invalidated exactly when a moving reference changes; reference-free strategies hold no model.

Models are real tiny torchtitan llama3s (dim 32); forwards are counted with forward hooks.
"""

import os

import datasets
import pytest
import torch

from refexp import titan
from refexp.algos.dpo_data import pack_pairs, pairs_fingerprint
from refexp.config import (
    EMAReferenceConfig,
    FixedReferenceConfig,
    ModelConfig,
    NoReferenceConfig,
    PeriodicResetReferenceConfig,
)
from refexp.reference import refcache
from refexp.reference.strategies import build_reference
from refexp.tasks.tokenizer import build_char_tokenizer

TOK = build_char_tokenizer()
MODEL = ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=4, ffn_hidden_dim=64, max_seq_len=64)


def tiny_model(seed: int) -> torch.nn.Module:
    return titan.build_model(MODEL, vocab_size=TOK.vocab_size, device="cpu", seed=seed, requires_grad=False)


def counted(model: torch.nn.Module) -> list:
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    return calls


@pytest.fixture(scope="module")
def pairs() -> datasets.Dataset:
    """Arithmetic-shaped pairs with completions of different lengths (ragged per-token rows)."""
    rows = {"prompt": [], "chosen": [], "rejected": []}
    for i in range(10):
        a, b = 11 * i, 7 * i + 3
        rows["prompt"].append(f"{a:03d}+{b:03d}=")
        rows["chosen"].append(f"{a + b:04d}")
        rows["rejected"].append(f"{a + b + 1:04d}"[: 1 + i % 4])
    return datasets.Dataset.from_dict(rows)


def forward_rows(logprobs, pairs):
    """compute(ids) as DPO's: one forward over [chosen; rejected] of those pairs."""

    def compute(ids):
        batch = pack_pairs(TOK, pairs.select(ids))
        with torch.inference_mode():
            logp = logprobs(batch.tokens_BT).clone()
        return refcache.RefLogps.from_logprobs(logp, batch.mask_BT)

    return compute


def test_reflogps_layout_matches_the_forward(pairs):
    model = tiny_model(0)
    batch = pack_pairs(TOK, pairs)
    with torch.inference_mode():
        logp = titan.token_logprobs(model, batch.tokens_BT).clone()
    rows = refcache.RefLogps.from_logprobs(logp, batch.mask_BT)
    B = len(pairs)
    expected = (logp * batch.mask_BT).sum(-1)
    torch.testing.assert_close(rows.chosen_N, expected[:B])
    torch.testing.assert_close(rows.rejected_N, expected[B:])
    # per-token chosen values land back exactly on the chosen completion mask
    torch.testing.assert_close(rows.chosen_tok_BT(batch.mask_BT[:B]), logp[:B] * batch.mask_BT[:B])
    # select / cat keep each row's ragged tokens with it
    picked = refcache.RefLogps.cat([rows.select([7, 2]), rows.select([2])])
    torch.testing.assert_close(picked.chosen_N, rows.chosen_N[[7, 2, 2]])
    sub = pack_pairs(TOK, pairs.select([7, 2, 2]))
    full = logp[:B][[7, 2, 2]] * batch.mask_BT[:B][[7, 2, 2]]  # right padding: a prefix of the columns
    torch.testing.assert_close(picked.chosen_tok_BT(sub.mask_BT[:3]), full[:, : sub.mask_BT.shape[1]])


def test_table_is_computed_once_and_reused_from_disk(pairs, tmp_path):
    model = tiny_model(0)
    calls = counted(model)
    compute = forward_rows(lambda t: titan.token_logprobs(model, t), pairs)
    sft_dir = tmp_path / "sft"
    sft_dir.mkdir()
    (sft_dir / "sft.json").write_text("{}")
    key = refcache.cache_key(sft_dir, "float32", pairs_fingerprint(pairs, TOK))
    path = refcache.cache_file(tmp_path / "cache", key)

    table, built = refcache.load_or_compute(path, lambda: refcache.compute_table(compute, len(pairs), 4),
                                            num_rows=len(pairs))
    assert built and path.is_file()
    assert len(calls) == 3  # ceil(10 / 4) batched forwards for the whole set, nothing more
    from refexp.record.cache_dirs import manifest_path

    # no temp file left; the table's manifest beside it
    assert sorted(p.name for p in path.parent.iterdir()) == sorted([path.name, manifest_path(path).name])

    # a second run (a new process would do the same): read from disk, no forward at all
    def never():
        raise AssertionError("recomputed although the cache file exists")

    again, built2 = refcache.load_or_compute(path, never, num_rows=len(pairs))
    assert not built2 and len(calls) == 3
    for a, b in zip(table.tensors().values(), again.tensors().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)

    # equal to a live forward of the same pairs in a different batch composition
    ids = [9, 0, 4, 4, 1]
    live = compute(ids)
    cached = again.select(ids)
    torch.testing.assert_close(cached.chosen_N, live.chosen_N, atol=1e-5, rtol=0)
    torch.testing.assert_close(cached.rejected_N, live.rejected_N, atol=1e-5, rtol=0)
    torch.testing.assert_close(cached.chosen_tok, live.chosen_tok, atol=1e-5, rtol=0)


def test_key_follows_reference_identity_dtype_and_data(pairs, tmp_path):
    sft_dir = tmp_path / "sft"
    sft_dir.mkdir()
    stamp = sft_dir / "sft.json"
    stamp.write_text("{}")
    fp = pairs_fingerprint(pairs, TOK)
    key = refcache.cache_key(sft_dir, "float32", fp)
    assert refcache.cache_key(sft_dir, "float32", fp) == key
    assert refcache.cache_key(sft_dir, "bfloat16", fp) != key
    assert refcache.cache_key(sft_dir, "float32", fp, {"dim": 64}) != key
    assert refcache.cache_key(sft_dir, "float32", pairs_fingerprint(pairs.select(range(9)), TOK)) != key
    os.utime(stamp, ns=(1, 1))  # the checkpoint was rewritten
    assert refcache.cache_key(sft_dir, "float32", fp) != key


def test_moving_reference_memo_is_invalidated_exactly_at_a_reset(pairs):
    ref_builds = []

    def build_frozen():
        ref_builds.append(1)
        return tiny_model(0)

    strategy = build_reference(PeriodicResetReferenceConfig(reset_every=3), build_frozen)
    policy = tiny_model(1)  # different weights: a reset changes the reference's log-probs
    calls = counted(strategy.model)
    compute = forward_rows(strategy.logprobs, pairs)
    memo = refcache.VersionedRefLogps(compute, lambda: strategy.version)

    first, hits, misses = memo.lookup([0, 1, 2, 3])
    assert (hits, misses, len(calls)) == (0, 4, 1)
    for step in (1, 2):  # no reset yet: memoised rows are hits, only new rows are computed
        assert not strategy.after_step(step, policy, {})
        rows, hits, misses = memo.lookup([2, 3, 4])
        assert (hits, misses) == ((2, 1) if step == 1 else (3, 0))
    assert len(calls) == 2
    torch.testing.assert_close(rows.select([0, 1]).chosen_N, first.select([2, 3]).chosen_N, rtol=0, atol=0)

    assert strategy.after_step(3, policy, {}) and strategy.version == 1  # the reset
    after, hits, misses = memo.lookup([0, 1, 2, 3])
    assert (hits, misses, len(calls)) == (0, 4, 3)
    live_policy = forward_rows(lambda t: titan.token_logprobs(policy, t), pairs)([0, 1, 2, 3])
    torch.testing.assert_close(after.chosen_N, live_policy.chosen_N, atol=1e-5, rtol=0)
    assert not torch.allclose(after.chosen_N, first.chosen_N)
    assert len(ref_builds) == 1


def test_reference_free_and_cached_fixed_references_hold_no_model():
    builds = []

    def build_frozen():
        builds.append(1)
        return tiny_model(0)

    none = build_reference(NoReferenceConfig(), build_frozen)
    assert none.model is None and none.ensure_model() is None and not builds
    assert none.logprobs(torch.zeros(1, 4, dtype=torch.long)) is None

    fixed = build_reference(FixedReferenceConfig(), build_frozen, defer_build=True)
    assert fixed.model is None and not builds  # deferred: built only when a cache misses
    model = fixed.ensure_model()
    assert builds == [1] and titan.count_parameters(model) > 0 and fixed.ensure_model() is model
    fixed.release_model()
    assert fixed.model is None

    moving = build_reference(EMAReferenceConfig(), build_frozen)
    with pytest.raises(RuntimeError, match="moves"):
        moving.release_model()


def test_concurrent_writers_leave_one_complete_file(pairs, tmp_path):
    """Two jobs of a sweep computing the same key at once: each writes a private temp file and renames
    it into place, so a reader only ever sees a complete table."""
    from concurrent.futures import ThreadPoolExecutor

    model = tiny_model(0)
    table = refcache.compute_table(forward_rows(lambda t: titan.token_logprobs(model, t), pairs), len(pairs), 4)
    path = refcache.cache_file(tmp_path, "k")
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: refcache.save(table, path), range(8)))
    from refexp.record.cache_dirs import manifest_path, verified_entry

    assert sorted(p.name for p in path.parent.iterdir()) == sorted([path.name, manifest_path(path).name])
    verified_entry(path, "reference log-probs")  # the table matches the manifest beside it
    torch.testing.assert_close(refcache.load(path).chosen_tok, table.chosen_tok, rtol=0, atol=0)
