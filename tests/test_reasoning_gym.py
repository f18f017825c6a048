"""``task=reasoning_gym`` (refexp/tasks/reasoning_gym.py, reasoning_gym_splits.py): disjoint splits, the dataset's
own scorer as the reward, prompts through the tokenizer's chat template, and the errors of a bad name or a
missing install."""

from __future__ import annotations

import json
import sys

import pytest

from refexp.config import ConfigError, TaskConfig
from refexp.tasks import build_task
from refexp.tasks import reasoning_gym as gym
from refexp.tasks.tokenizer import TextTokenizer
from tests.helpers.tiny_qwen3 import chat_tokenizer

reasoning_gym = pytest.importorskip("reasoning_gym", reason="the optional extra pip install -e '.[gym]' (in .[test])")

# One-digit sums of two terms: a space of a few hundred questions, so distinct seeds repeat questions and only the
# de-duplication keeps the splits apart.
SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "chat"
    chat_tokenizer(path)
    return str(path)


def _cfg(tokenizer_dir, **kw) -> TaskConfig:
    base = dict(name="reasoning_gym", dataset="chain_sum", dataset_kwargs=SMALL, tokenizer_path=tokenizer_dir,
                chat_template=True, num_train=120, num_eval=40, val_fraction=0.25, max_prompt_len=2048,
                max_new_tokens=32, retention_datasets=[{"name": "basic_arithmetic", **SMALL}])
    base.update(kw)
    return TaskConfig(**base)


def test_train_validation_test_and_retained_questions_never_overlap(tokenizer_dir, tmp_path):
    task = build_task(_cfg(tokenizer_dir), str(tmp_path))
    splits = {"train": task.train, "val": task.val, "eval": task.eval, "retain_eval": task.retain_eval,
              "retain_val": task.retain_val}
    sizes = {k: len(ds) for k, ds in splits.items()}
    assert sizes == {"train": 90, "val": 30, "eval": 40, "retain_eval": 40, "retain_val": 30}
    questions = {k: list(ds["question"]) for k, ds in splits.items()}
    every = [q for qs in questions.values() for q in qs]
    assert len(set(every)) == len(every), "a question appears twice within or across splits"
    assert all(json.loads(a)["dataset"] == "chain_sum" for a in list(task.train["answer"]) + list(task.eval["answer"]))
    assert all(json.loads(a)["dataset"] == "basic_arithmetic" for a in task.retain_eval["answer"])


def test_a_space_too_small_for_the_sizes_is_refused(tokenizer_dir, tmp_path):
    tiny = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"],
            "allow_negation": False, "allow_parentheses": False}
    with pytest.raises(ConfigError, match="task.dataset='basic_arithmetic'.*too small"):
        build_task(_cfg(tokenizer_dir, dataset="basic_arithmetic", dataset_kwargs=tiny, num_train=500,
                        retention_datasets=[]), str(tmp_path))


def test_the_reward_is_the_datasets_own_scorer_on_the_tagged_answer(tokenizer_dir, tmp_path):
    task = build_task(_cfg(tokenizer_dir, dataset="basic_arithmetic", retention_datasets=["chain_sum"]),
                      str(tmp_path))
    own = reasoning_gym.create_dataset("basic_arithmetic", **SMALL)
    retained = reasoning_gym.create_dataset("chain_sum")
    for rows, scorer in ((task.eval, own), (task.retain_eval, retained)):
        record = json.loads(rows["answer"][0])
        entry = {"answer": record["answer"], "metadata": record["metadata"]}
        oracle = entry["answer"]
        # correct; wrong but containing the oracle (basic_arithmetic's scorer gives partial credit, chain_sum's
        # compares numbers); wrong; untagged (reasoning-gym's extraction finds no answer)
        for completion, answer in ((f"so <answer>{oracle}</answer>", oracle), (f"<answer>{oracle}0</answer>", oracle + "0"),
                                   ("<answer>x</answer>", "x"), (oracle, None)):
            want = scorer.score_answer(answer, entry)
            assert task.reward(completion, rows["answer"][0]) == want, (completion, want)
        assert task.reward(f"<answer>{oracle}</answer>", rows["answer"][0]) == 1.0
    partial = json.loads(task.eval["answer"][0])["answer"]
    assert 0 < task.reward(f"<answer>{partial}0</answer>", task.eval["answer"][0]) < 1  # the scorer's partial credit


def test_an_answer_prefill_ends_every_prompt_and_is_read_with_the_completion(tokenizer_dir, tmp_path):
    task = build_task(_cfg(tokenizer_dir, answer_prefill="<answer>"), str(tmp_path))
    for rows in (task.train, task.eval, task.retain_eval):
        oracle = json.loads(rows["answer"][0])["answer"]
        assert rows["prompt"][0].endswith("<|im_start|>assistant\n<answer>")
        assert rows["completion"][0] == f"{oracle}</answer>"  # the SFT target continues the prefill
        assert task.reward(f"{oracle}</answer>", rows["answer"][0]) == 1.0
        assert task.reward(f"{oracle}", rows["answer"][0]) == 0.0  # unclosed: reasoning-gym's extraction finds none


def test_prompts_carry_the_chat_template_and_reasoning_gyms_system_prompt(tokenizer_dir, tmp_path):
    import transformers
    from reasoning_gym.utils import SYSTEM_PROMPTS

    hf = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    task = build_task(_cfg(tokenizer_dir), str(tmp_path))
    for rows in (task.train, task.eval, task.val, task.retain_eval):
        row = rows[0]
        messages = [{"role": "system", "content": SYSTEM_PROMPTS["default"]},
                    {"role": "user", "content": row["question"]}]
        assert row["prompt"] == hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert row["prompt"].endswith("<|im_start|>assistant\n")
    assert task.train["completion"][0] == f"<answer>{json.loads(task.train['answer'][0])['answer']}</answer>"
    plain = build_task(_cfg(tokenizer_dir, chat_template=False), str(tmp_path))
    assert "<|im_start|>" not in plain.eval["prompt"][0]  # the plain role: content fallback
    assert plain.eval["prompt"][0].endswith(f"user: {plain.eval['question'][0]}\nassistant: ")


def test_an_unknown_dataset_is_named_with_the_valid_ones(tokenizer_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"task.dataset='basic_arithmetc' is invalid: expected a reasoning-gym "
                                          r"dataset, one of .*basic_arithmetic, .*chain_sum"):
        build_task(_cfg(tokenizer_dir, dataset="basic_arithmetc"), str(tmp_path))
    with pytest.raises(ConfigError, match=r"task.retention_datasets\[\]='leg_countin' is invalid"):
        build_task(_cfg(tokenizer_dir, retention_datasets=["leg_countin"]), str(tmp_path))
    with pytest.raises(ConfigError, match="task.retention_datasets.*other than task.dataset"):
        _cfg(tokenizer_dir, retention_datasets=["chain_sum"])
    with pytest.raises(ConfigError, match="task.dataset=None is invalid"):
        _cfg(tokenizer_dir, dataset=None)


def test_without_the_extra_the_error_names_it(monkeypatch, tokenizer_dir, tmp_path):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym now raises ImportError
    with pytest.raises(ConfigError, match=r"task=reasoning_gym needs the reasoning-gym package.*"
                                          r"pip install -e '\.\[gym\]'"):
        build_task(_cfg(tokenizer_dir), str(tmp_path))


def test_the_task_fingerprint_follows_the_dataset_and_its_config(tokenizer_dir):
    from refexp.tasks import task_fingerprint

    base = task_fingerprint(_cfg(tokenizer_dir))
    assert task_fingerprint(_cfg(tokenizer_dir)) == base
    assert task_fingerprint(_cfg(tokenizer_dir, dataset_kwargs={**SMALL, "max_digits": 2})) != base
    assert task_fingerprint(_cfg(tokenizer_dir, retention_datasets=[])) != base
    assert TextTokenizer.from_dir(tokenizer_dir).chat_template is not None
