"""The shared-prompt DPO layout: one row per pair whose log-probs (and the DPO loss's gradients) equal
the two-row ``[chosen; rejected]`` pass, the layout itself checked by hand on a small pair, and the
config check that it needs the SDPA backend."""

from functools import partial

import datasets
import pytest
import torch

from refexp import titan
from refexp.algos.dpo_data import pack_pairs
from refexp.algos.shared_prompt import pair_logprobs, share_prompts
from refexp.config import ConfigError, ModelConfig
from refexp.losses import dpo_loss
from refexp.losses.kl import masked_sum
from refexp.tasks.tokenizer import build_char_tokenizer
from tests.helpers.configs import compose_tiny_run

pytestmark = pytest.mark.numerics  # tests/README.md: run under other CPU kernels too

TOK = build_char_tokenizer()
MODEL = ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden_dim=64, max_seq_len=64)


def _pairs() -> datasets.Dataset:
    """Prompts of 1..9 characters (plus BOS) and completions of different lengths on both sides."""
    rows = {"prompt": [], "chosen": [], "rejected": []}
    for i in range(8):
        rows["prompt"].append("123456789"[: 1 + (i * 5) % 9])
        rows["chosen"].append("0123"[: 1 + i % 4])
        rows["rejected"].append("98765"[: 1 + (3 * i) % 5])
    return datasets.Dataset.from_dict(rows)


def test_layout_of_one_pair_by_hand():
    batch = pack_pairs(TOK, {"prompt": ["12"], "chosen": ["3"], "rejected": ["45"]})
    s = share_prompts(batch, TOK.pad_id)
    # tokens: [bos] 1 2 | 3 eos | bridge=2 | 4 5 eos   (p=3 with BOS, c=2, r=3)
    p = batch.tokens_BT[0].tolist().index(TOK.encode("3")[0])
    assert p == 3
    row = s.tokens_US[0].tolist()
    assert row[:p + 2] == batch.tokens_BT[0, :p + 2].tolist()
    assert row[p + 2] == batch.tokens_BT[0, p - 1]  # the bridge repeats the prompt's last token
    assert row[p + 3:] == batch.tokens_BT[1, p:p + 3].tolist()
    assert s.positions_US[0].tolist() == [0, 1, 2, 3, 4, 2, 3, 4, 5]
    allowed = s.allowed_USS[0]
    # prompt + chosen are causal; the bridge (index 5) sees prompt tokens 0..1 and itself
    assert allowed[4].tolist() == [True] * 5 + [False] * 4
    assert allowed[5].tolist() == [True, True, False, False, False, True, False, False, False]
    # the last rejected token sees prompt 0..1, the bridge and the rejected tokens, never the chosen ones
    assert allowed[8].tolist() == [True, True, False, False, False, True, True, True, True]
    # chosen columns stay; rejected columns move past chosen (2 tokens) and the bridge
    assert s.src_NT[0, p - 1:p + 1].tolist() == [p - 1, p]
    assert s.src_NT[1, p - 1:p + 2].tolist() == [p + 2, p + 3, p + 4]


@pytest.mark.parametrize("attention", ["mask", "rows"])
def test_shared_logprobs_equal_the_two_row_pass(attention):
    """Either way of attending (dense mask, or causal attention over gathered usual rows)."""
    torch.manual_seed(0)
    model = titan.build_model(MODEL, vocab_size=TOK.vocab_size, device="cpu", seed=0)
    batch = pack_pairs(TOK, _pairs())
    shared = share_prompts(batch, TOK.pad_id, attention=attention)
    assert (shared.rows is not None) == (attention == "rows") and (shared.allowed_USS is None) == (attention == "rows")
    assert shared.tokens_US.numel() < batch.tokens_BT.numel()
    lp = partial(titan.token_logprobs, model)
    two_rows = pair_logprobs(lp, batch, None)
    one_row = pair_logprobs(lp, batch, shared)
    assert torch.equal(one_row != 0, batch.mask_BT)
    torch.testing.assert_close(one_row, torch.where(batch.mask_BT, two_rows, 0.0), atol=1e-5, rtol=0)

    def grads(logp):
        B = batch.num_pairs
        seq = masked_sum(logp, batch.mask_BT, dim=-1)
        ref = seq.detach() - 0.3  # any reference: the loss is non-trivial and its gradient flows through seq
        loss, _ = dpo_loss(seq[:B], seq[B:], ref[:B], ref[B:], beta=0.5)
        model.zero_grad(set_to_none=True)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    l2, g2 = grads(pair_logprobs(lp, batch, None))
    l1, g1 = grads(pair_logprobs(lp, batch, shared))
    torch.testing.assert_close(l1, l2, atol=1e-6, rtol=0)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_reference_strategy_takes_the_shared_layout():
    from refexp.config import FixedReferenceConfig
    from refexp.reference.strategies import build_reference

    model = titan.build_model(MODEL, vocab_size=TOK.vocab_size, device="cpu", seed=1, requires_grad=False)
    strategy = build_reference(FixedReferenceConfig(), lambda: model)
    batch = pack_pairs(TOK, _pairs())
    shared = share_prompts(batch, TOK.pad_id)
    torch.testing.assert_close(pair_logprobs(strategy.logprobs, batch, shared),
                               torch.where(batch.mask_BT, pair_logprobs(strategy.logprobs, batch, None), 0.0),
                               atol=1e-5, rtol=0)


def test_gathered_rows_gradients_equal_the_usual_layout():
    """A GRPO-like group of 16 long completions after a short prompt: "auto" attends through gathered
    usual rows (fewer query-key pairs than the dense mask, which it never builds), and the log-probs and
    every parameter gradient equal the usual layout's."""
    from refexp.algos.shared_prompt import attention_way, row_logprobs, share_groups

    model = titan.build_model(MODEL, vocab_size=TOK.vocab_size, device="cpu", seed=3)
    g = torch.Generator().manual_seed(0)
    p, G, c = 4, 16, 40
    prompt = torch.randint(3, TOK.vocab_size, (p,), generator=g)
    lengths = [c - (i % 5) for i in range(G)]  # ragged, right-padded
    tokens = torch.full((G, p + c), TOK.pad_id, dtype=torch.long)
    mask = torch.zeros(G, p + c - 1, dtype=torch.bool)
    for i, n in enumerate(lengths):
        tokens[i, :p] = prompt
        tokens[i, p:p + n] = torch.randint(3, TOK.vocab_size, (n,), generator=g)
        mask[i, p - 1:p - 1 + n] = True
    shared = share_groups(tokens, mask, G, TOK.pad_id)
    S, T = shared.tokens_US.shape[1], p + c
    assert attention_way(G, T, 1, S) == "rows"
    assert shared.rows is not None and shared.allowed_USS is None
    lp = partial(titan.token_logprobs, model)

    def logp_and_grads(sh):
        model.zero_grad(set_to_none=True)
        logp = torch.where(mask, row_logprobs(lp, tokens, mask, sh), 0.0)  # the usual layout scores pads too
        (logp * torch.linspace(0.5, 1.5, logp.numel()).view_as(logp)).sum().backward()
        return logp.detach(), [q.grad.clone() for q in model.parameters()]

    usual_logp, usual_g = logp_and_grads(None)
    logp, grads = logp_and_grads(shared)
    torch.testing.assert_close(logp, usual_logp, atol=1e-5, rtol=0)
    for a, b in zip(grads, usual_g):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    # and the dense mask of the same layout gives the same
    dense = share_groups(tokens, mask, G, TOK.pad_id, attention="mask")
    torch.testing.assert_close(logp_and_grads(dense)[0], logp, atol=1e-5, rtol=0)


def test_short_groups_keep_the_dense_mask():
    batch = pack_pairs(TOK, _pairs())
    shared = share_prompts(batch, TOK.pad_id)
    assert shared.rows is None and shared.allowed_USS is not None
    with pytest.raises(ValueError, match="attention='dense': expected 'auto', 'mask' or 'rows'"):
        share_prompts(batch, TOK.pad_id, attention="dense")


def test_pairs_with_different_prompts_are_refused():
    batch = pack_pairs(TOK, {"prompt": ["12"], "chosen": ["3"], "rejected": ["4"]})
    batch.tokens_BT[1, 1] = TOK.encode("9")[0]
    with pytest.raises(ValueError, match="rows 0 and 1: completions of one group do not share the prompt"):
        share_prompts(batch, TOK.pad_id)


def test_share_prompt_needs_sdpa(tmp_path):
    from refexp.config import to_object

    with pytest.raises(ConfigError, match="algo.share_prompt=true needs model.attn_backend=sdpa"):
        to_object(compose_tiny_run(tmp_path, "algo=dpo", "model.attn_backend=flex"))
    assert not to_object(compose_tiny_run(tmp_path, "algo=dpo", "model.attn_backend=flex",
                                     "algo.share_prompt=false")).algo.share_prompt


@pytest.mark.parametrize("attention", ["mask", "rows"])
def test_grpo_groups_share_their_prompt(attention):
    """Rollouts of 3 prompts x 4 samples (ragged completions, one right-padded batch, as the sampler
    lays them out): log-probs and entropies of the shared rows equal the usual ones, either way of attending."""
    from refexp.algos.shared_prompt import row_logprobs, share_groups
    from refexp.components import sampler

    model = titan.build_model(MODEL, vocab_size=TOK.vocab_size, device="cpu", seed=2)
    prompts = [p for p in ("12+34=", "5+6=", "789+1=") for _ in range(4)]
    r = sampler.generate(model, TOK, prompts, max_new_tokens=6, keys=[(0, 1, i) for i in range(12)])
    assert len(set(len(c) for c in r.completion_ids)) > 1  # ragged: the layout must not assume equal lengths
    shared = share_groups(r.tokens_BT, r.mask_BT, 4, TOK.pad_id, attention=attention)
    assert shared.tokens_US.shape[0] == 3 and shared.tokens_US.numel() < r.tokens_BT.numel()
    lp = partial(titan.token_logprobs, model)
    usual_logp, usual_ent = row_logprobs(lp, r.tokens_BT, r.mask_BT, None, temperature=0.7, with_entropy=True)
    logp, ent = row_logprobs(lp, r.tokens_BT, r.mask_BT, shared, temperature=0.7, with_entropy=True)
    m = r.mask_BT
    torch.testing.assert_close(logp, torch.where(m, usual_logp, 0.0), atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, torch.where(m, usual_ent, 0.0), atol=1e-5, rtol=0)
    # and both equal the sampler's behaviour log-probs (temperature 1)
    torch.testing.assert_close(row_logprobs(lp, r.tokens_BT, m, shared), r.behaviour_logp, atol=1e-4, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "dpo"])
def test_runs_with_and_without_sharing_agree(tmp_path, algo):
    """The same steps with algo.share_prompt true and false log the same losses and rewards."""
    from refexp.record.metrics import read_metrics
    from refexp.run import run
    from tests.helpers.configs import TINY_GRPO_OVERRIDES

    extra = TINY_GRPO_OVERRIDES if algo == "grpo" else ["algo=dpo", "algo.num_pairs=32", "algo.pairs_per_step=8",
                                         "training.steps=3", "training.lr=1e-3"]
    rows = {}
    for share in ("true", "false"):
        run(compose_tiny_run(tmp_path / share, *extra, f"algo.share_prompt={share}"))
        rows[share] = read_metrics(tmp_path / share)
    keys = (["loss/total", "reward/mean", "kl/ref"] if algo == "grpo"
            else ["loss/total", "rewards/margins", "kl/ref_chosen_tokens"])
    assert [r["step"] for r in rows["true"]] == [r["step"] for r in rows["false"]]
    for a, b in zip(rows["true"][1:], rows["false"][1:]):
        for k in keys:
            assert a[k] == pytest.approx(b[k], abs=1e-5), (a["step"], k)
