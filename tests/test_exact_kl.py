"""``kl/init_exact``: at each position of a sampled completion the KL of the policy's next-token distribution from
the start model's, summed over the vocabulary (refexp/titan/exact_kl.py), averaged over completion tokens as
``kl/init`` is (refexp/components/evaluation.py ``kl_to_anchor``).

Checked against a hand computation (the sum p log p/q written out over a small vocabulary, and over two tiny
models' full logits with the completion mask and the token-weighted mean), and as the expectation of the sampled
token's k3: the mean k3 of many tokens sampled at one position lies within its standard error of the exact KL, and
the reverse KL does not.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from refexp import titan
from refexp.components import sampler
from refexp.components.evaluation import kl_influence, kl_sample_key, kl_to_anchor
from refexp.losses.kl import kl_estimate
from refexp.tasks.tokenizer import build_char_tokenizer
from refexp.titan.exact_kl import OutputStates, position_kl
from tests.helpers.models import tiny_model_config

TEMPERATURE = 0.7


def _hand_kl(logits_p: list[float], logits_q: list[float], temperature: float) -> float:
    """sum_v p(v) log(p(v) / q(v)) of softmax(logits / temperature), written out."""
    def softmax(z):
        e = [math.exp(x / temperature) for x in z]
        return [x / sum(e) for x in e]
    p, q = softmax(logits_p), softmax(logits_q)
    return sum(pv * math.log(pv / qv) for pv, qv in zip(p, q))


def test_position_kl_is_the_sum_over_the_vocabulary_of_p_log_p_over_q():
    """Three positions over a vocabulary of 4, logits given as hidden states through an identity output layer
    (and a bias), at temperature 1 and 0.7: each position's KL(p ‖ q) is the hand sum."""
    zp = [[1.0, 0.0, -1.0, 0.5], [0.0, 0.0, 0.0, 0.0], [3.0, -2.0, 0.1, 0.2]]
    zq = [[0.0, 1.0, -0.5, 0.5], [0.0, 0.0, 0.0, 0.0], [-1.0, 2.0, 0.3, 0.0]]
    bias = [0.2, -0.1, 0.0, 0.3]
    eye = torch.eye(4)
    p = OutputStates(torch.tensor(zp), eye, torch.tensor(bias))
    q = OutputStates(torch.tensor(zq), eye, torch.tensor(bias))
    for t in (1.0, TEMPERATURE):
        want = [_hand_kl([a + b for a, b in zip(rp, bias)], [a + b for a, b in zip(rq, bias)], t)
                for rp, rq in zip(zp, zq)]
        assert position_kl(p, q, t).tolist() == pytest.approx(want, rel=1e-5, abs=1e-7)
    assert position_kl(p, q)[1] == 0.0  # equal distributions


def test_position_kl_in_chunks_equals_one_piece(monkeypatch):
    """More positions than one chunk (``FP32_CHUNK_ELEMENTS // V``): each position's value as in one piece (up to
    the rounding of another matmul shape; a chunk lost or misplaced is off by O(1))."""
    from refexp.titan import exact_kl

    g = torch.Generator().manual_seed(0)
    p = OutputStates(torch.randn(37, 8, generator=g), torch.randn(11, 8, generator=g), None)
    q = OutputStates(torch.randn(37, 8, generator=g), torch.randn(11, 8, generator=g), None)
    whole = position_kl(p, q, TEMPERATURE)
    monkeypatch.setattr(exact_kl, "FP32_CHUNK_ELEMENTS", 11 * 5)  # 5 positions a chunk: 8 chunks
    torch.testing.assert_close(position_kl(p, q, TEMPERATURE), whole, rtol=1e-5, atol=1e-6)


def _models(vocab: int):
    """A policy and a frozen model of another seed, its output layer scaled so the two distributions differ
    clearly (KL(p ‖ q) and KL(q ‖ p) apart by many standard errors of a k3 mean)."""
    cfg = tiny_model_config(vocab_size=vocab)
    policy = titan.build_model(cfg, vocab_size=vocab, device="cpu", seed=0, requires_grad=False)
    start = titan.build_model(cfg, vocab_size=vocab, device="cpu", seed=1, requires_grad=False)
    with torch.no_grad():
        start.lm_head.weight.mul_(3.0)
    return policy, start


def _hand_position_kl(model, other, tokens_BT: torch.Tensor, temperature: float) -> torch.Tensor:
    """[B, T-1] float64 KL(model ‖ other) at every position, from both models' full logits."""
    lp = torch.log_softmax(titan.logits(model, tokens_BT)[:, :-1].double() / temperature, -1)
    lq = torch.log_softmax(titan.logits(other, tokens_BT)[:, :-1].double() / temperature, -1)
    return (lp.exp() * (lp - lq)).sum(-1)


def test_kl_to_anchor_exact_is_the_token_weighted_mean_of_each_positions_kl():
    """Two completions sampled per prompt (``samples=2``, keys ``kl_sample_key``), of different lengths: the metric
    is the sum of the full-logits KL over every completion token (the mask: no prompt token, no padding) divided by
    their number, as kl/init's k3; each prompt's contribution is its two samples' KL and tokens summed."""
    tok = build_char_tokenizer()
    policy, start = _models(tok.vocab_size)
    from datasets import Dataset

    prompts = ["12+34=", "5+6=", "123+456=", "7+8=", "99+1="]
    task = SimpleNamespace(eval=Dataset.from_dict({"prompt": prompts}), tokenizer=tok, max_new_tokens=7)
    per_prompt: dict[str, list[float]] = {}
    got = kl_to_anchor(policy, {}, task, len(prompts), seed=3, temperature=TEMPERATURE, exact={"exact": start},
                       samples=2, per_prompt=per_prompt, batch_size=4)  # 2 prompts x 2 samples a batch
    kl_sum, tokens = [0.0] * len(prompts), [0.0] * len(prompts)
    lengths = set()
    for j in range(2):
        r = sampler.generate(policy, tok, prompts, max_new_tokens=7, temperature=TEMPERATURE,
                             keys=[kl_sample_key(3, i, j) for i in range(len(prompts))])
        kl_BT = _hand_position_kl(policy, start, r.tokens_BT, TEMPERATURE)
        for i in range(len(prompts)):
            kl_sum[i] += float(kl_BT[i][r.mask_BT[i]].sum())
            tokens[i] += float(r.mask_BT[i].sum())
            lengths.add(int(r.mask_BT[i].sum()))
    assert len(lengths) > 1  # ragged completions: a mask that counts padding would show
    assert got["exact"] == pytest.approx(sum(kl_sum) / sum(tokens), rel=1e-5)
    assert per_prompt["exact"] == pytest.approx(kl_influence(kl_sum, tokens), rel=1e-5)
    assert got["exact"] > 0.1


def test_one_sample_per_prompt_draws_what_the_first_of_several_draws():
    """``samples=1`` keys each prompt's completion as kl/init always has ((seed, KL_INIT_KEY, prompt)); with 2 the
    first sample is that same completion and the second another."""
    from refexp.components.evaluation import KL_INIT_KEY

    assert kl_sample_key(3, 5, 0) == (3, KL_INIT_KEY, 5)
    assert kl_sample_key(3, 5, 1) != kl_sample_key(3, 5, 0) and kl_sample_key(3, 5, 1)[1] < 0  # no training step's


def test_the_exact_kl_is_the_expectation_of_the_sampled_tokens_k3():
    """At one position, the k3 of N tokens sampled from the policy (each scored by both models through the
    trainer's log-prob path) averages to the exact KL within 4 standard errors of that mean; the reverse
    KL(q ‖ p), the exact KL of the other direction, lies many standard errors away (so a swapped direction fails)."""
    tok = build_char_tokenizer()
    policy, start = _models(tok.vocab_size)
    prefix = torch.tensor([tok.encode("12+34=")])
    select = torch.zeros(1, prefix.shape[1] - 1, dtype=torch.bool)
    select[0, -1] = True  # the last prompt position: the distribution of the first completion token
    ext = torch.cat([prefix, torch.zeros(1, 1, dtype=torch.long)], 1)  # one more column: a token drawn there
    sel = torch.cat([torch.zeros_like(select), torch.ones(1, 1, dtype=torch.bool)], 1)
    exact = float(titan.token_kl(policy, start, ext, select_BT=sel, temperature=TEMPERATURE)[0, -1])
    reverse = float(titan.token_kl(start, policy, ext, select_BT=sel, temperature=TEMPERATURE)[0, -1])

    n = 20_000
    logp_V = torch.log_softmax(titan.logits(policy, prefix)[0, -1].double() / TEMPERATURE, -1)
    drawn = torch.multinomial(logp_V.exp(), n, replacement=True, generator=torch.Generator().manual_seed(0))
    rows = torch.cat([prefix.expand(n, -1), drawn[:, None]], 1)  # [n, T+1]: the prefix and one sampled token
    mask = sel.expand(n, -1)
    lp = titan.token_logprobs(policy, rows, temperature=TEMPERATURE, select_BT=mask)[:, -1]
    lq = titan.token_logprobs(start, rows, temperature=TEMPERATURE, select_BT=mask)[:, -1]
    k3 = kl_estimate(lp, lq, "k3").double()
    se = float(k3.std()) / math.sqrt(n)
    assert abs(float(k3.mean()) - exact) < 4 * se, (float(k3.mean()), exact, se)
    assert abs(float(k3.mean()) - reverse) > 10 * se, (float(k3.mean()), reverse, se)
