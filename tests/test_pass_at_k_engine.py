"""``eval/pass_at_k`` per prompt against a scripted engine whose per-prompt correct counts are known: each
prompt's estimate is ``pass_at_k(n, c, k)`` of its own n completions (``refexp.components.evaluation.
sampled_pass_at_k``), so reading another prompt's rewards (a slice off by a row) shows."""

from __future__ import annotations

from types import SimpleNamespace

import datasets
import pytest
import torch

from refexp.components.evaluation import PASS_K_KEY, pass_at_k, sampled_pass_at_k

CORRECT = [0, 4, 1, 3, 2, 0, 4]
"""Correct completions of each prompt, out of N."""
N, K = 4, 2


class ScriptedEngine:
    """Completion j of prompt i (key ``(seed, PASS_K_KEY, i * N + j)``) is right when j < CORRECT[i]."""

    name = "scripted"

    def generate(self, prompts, *, max_new_tokens, temperature=1.0, top_p=1.0, greedy=False, keys=None,
                 max_prompt_len=None):
        texts = []
        for key in keys:
            assert key[1] == PASS_K_KEY
            i, j = divmod(key[2], N)
            texts.append("right" if j < CORRECT[i] else "wrong")
        return SimpleNamespace(texts=texts)


def scripted_task():
    prompts = [f"p{i}" for i in range(len(CORRECT))]
    return SimpleNamespace(
        eval=datasets.Dataset.from_dict({"prompt": prompts, "answer": ["a"] * len(prompts)}),
        tokenizer=None, max_new_tokens=4,
        verify=lambda texts, answers, prompts: [1.0 if t == "right" else 0.0 for t in texts])


@pytest.mark.parametrize("batch_size", [4 * N, 64])  # several prompts per generate call, and all at once
def test_each_prompts_pass_at_k_is_that_of_its_own_completions(batch_size):
    scores: list[float] = []
    mean = sampled_pass_at_k(torch.nn.Linear(1, 1), scripted_task(), len(CORRECT), k=K, n=N, seed=0,
                             batch_size=batch_size, engine=ScriptedEngine(), scores=scores)
    want = [pass_at_k(N, c, K) for c in CORRECT]
    assert scores == pytest.approx(want, abs=1e-12)
    assert scores[0] == 0.0 and scores[1] == 1.0  # 0 of 4 right scores 0; 4 of 4 scores 1
    assert mean == pytest.approx(sum(want) / len(want), abs=1e-12)
