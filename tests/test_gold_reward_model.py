"""The gold reward is ``task.gold_reward_model``'s own classifier, the optimised one ``task.reward_model``'s
(``refexp/tasks/reward_sum.py``, ``build_rewards``): with two different classifiers, each score is its own
model's, so a gold loaded from the proxy's path shows."""

from __future__ import annotations

import pytest
import torch

from refexp.config import TaskConfig
from refexp.tasks.reward_model import RewardModel
from refexp.tasks.reward_sum import build_rewards

transformers = pytest.importorskip("transformers")


def _classifier(hf_dir, out, seed: int):
    """A one-label Qwen3 sequence classifier (weights of ``seed``) with the tiny Qwen3's tokenizer."""
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    config = transformers.AutoConfig.from_pretrained(hf_dir, num_labels=1, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    transformers.Qwen3ForSequenceClassification(config).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def test_proxy_and_gold_each_score_with_their_own_classifier(hf_dir, tmp_path):
    proxy, gold = _classifier(hf_dir, tmp_path / "proxy", 1), _classifier(hf_dir, tmp_path / "gold", 2)
    prompts, completions, answers = ["Tom has 3 apples.", "How many?"], ["He has 5.\n#### 5", "7"], ["5", "7"]
    want_proxy = RewardModel(proxy, field_name="proxy")(prompts, completions)
    want_gold = RewardModel(gold, field_name="gold")(prompts, completions)
    assert want_proxy != pytest.approx(want_gold, abs=1e-4)  # two different classifiers: the test can tell them apart

    optimised, gold_fn = build_rewards(TaskConfig(reward_model=proxy, gold_reward_model=gold),
                                       lambda p, c, a: [0.0] * len(c))
    assert optimised(prompts, completions, answers) == pytest.approx(want_proxy, abs=1e-6)
    assert gold_fn(prompts, completions, answers) == pytest.approx(want_gold, abs=1e-6)
