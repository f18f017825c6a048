"""Bring your own data and reward: sources `datasets.load_dataset` accepts (Hub ids checked before any
model is built), configurable columns, the validation split, the `task.reward` hook, length checks that
fit the algorithm."""

from __future__ import annotations

import json
import re
import time

import datasets
import pytest

from refexp.config import ConfigError, TaskConfig
from refexp.record.metrics import read_metrics
from refexp.record.status import read_status
from refexp.run import run, validate
from refexp.tasks import build_task, sources
from refexp.tasks.gsm8k import load_gsm8k
from refexp.tasks.preference import load_preference
from refexp.tasks.rewards import gsm8k_reward, load_reward
from refexp.tasks.tokenizer import build_char_tokenizer
from tests.helpers.configs import TINY_GRPO_OVERRIDES, compose_tiny_run

ROWS = [{"question": f"What is {i} plus 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(30)]


def _jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _tok(tmp_path) -> str:
    text = "Question: Answer: " + "".join(r["question"] + r["answer"] for r in ROWS)
    build_char_tokenizer("".join(sorted(set(text)))).save(str(tmp_path / "tok"))
    return str(tmp_path / "tok")


# ---------------------------------------------------------------- Hub ids, checked in validate
def test_hub_id_offline_fails_fast_naming_the_field_and_the_local_alternative(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = compose_tiny_run(tmp_path, "task=gsm8k", "task.train_path=openai/gsm8k", "task.dataset_config=main")
    start = time.monotonic()
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert time.monotonic() - start < 10
    msg = str(e.value)
    assert msg.startswith("task.train_path='openai/gsm8k' is not a local file or folder and the Hugging Face Hub "
                          "cannot be reached (offline")
    assert "datasets.load_dataset('openai/gsm8k', 'main').save_to_disk('gsm8k')" in msg
    assert "pass task.train_path=gsm8k (or a .jsonl/.parquet file)" in msg


def test_unreachable_hub_is_bounded_by_the_timeout(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(sources, "HUB_TIMEOUT_S", 0.3)
    monkeypatch.setattr(sources, "_dataset_info", lambda repo_id: time.sleep(30))  # a hung DNS lookup
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"task.eval_path='someone/data' is not a local .*\(offline\)"):
        sources.check_source("task.eval_path", "someone/data")
    assert time.monotonic() - start < 2

    def refused(repo_id):
        raise ConnectionRefusedError("no route")

    monkeypatch.setattr(sources, "_dataset_info", refused)
    with pytest.raises(ConfigError, match=r"\(offline\)"):
        sources.check_source("task.train_path", "gsm8k")


def test_missing_local_file_is_not_taken_for_a_hub_id(tmp_path):
    for path in (str(tmp_path / "train.jsonl"), "data/train.jsonl", "./x/y/z"):
        assert not sources.looks_like_hub_id(path)
        with pytest.raises(ConfigError, match=re.escape(f"task.train_path={path!r} does not exist")):
            sources.check_source("task.train_path", path)
    assert sources.looks_like_hub_id("openai/gsm8k") and sources.looks_like_hub_id("gsm8k")


# ---------------------------------------------------------------- sources, splits, columns
def test_saved_dataset_dict_and_data_dir_with_split_fields(tmp_path):
    raw = datasets.Dataset.from_list(ROWS)
    datasets.DatasetDict(train=raw.select(range(20)), test=raw.select(range(20, 30))).save_to_disk(
        str(tmp_path / "gsm8k"))
    cfg = TaskConfig(name="gsm8k", train_path=str(tmp_path / "gsm8k"), eval_path=str(tmp_path / "gsm8k"),
                     tokenizer_path=_tok(tmp_path), max_new_tokens=32)
    task = build_task(cfg, str(tmp_path / "cache"))
    assert (len(task.train), len(task.eval), task.val) == (20, 10, None)
    assert task.eval[0]["answer"] == "21"
    with pytest.raises(ConfigError, match="has no split 'dev': expected one of train, test"):
        load_gsm8k(str(tmp_path / "gsm8k"), split="dev")

    data_dir = tmp_path / "data_dir"  # a folder of files, split names from the file names
    data_dir.mkdir()
    _jsonl(data_dir / "train.jsonl", ROWS[:25])
    _jsonl(data_dir / "test.jsonl", ROWS[25:])
    assert len(load_gsm8k(str(data_dir), split="test", cache_dir=str(tmp_path / "c"))) == 5
    raw.to_csv(str(tmp_path / "gsm.csv"))
    assert load_gsm8k(str(tmp_path / "gsm.csv"), cache_dir=str(tmp_path / "c"))["answer"][:2] == ["1", "2"]


def test_column_names_are_configurable(tmp_path):
    path = _jsonl(tmp_path / "q.jsonl", [{"problem": r["question"], "solution": r["answer"]} for r in ROWS[:3]])
    ds = load_gsm8k(path, question_column="problem", answer_column="solution", cache_dir=str(tmp_path / "c"))
    assert ds[0] == {"prompt": "Question: What is 0 plus 1?\nAnswer:", "completion": " 0 + 1 = 1\n#### 1",
                     "answer": "1"}
    with pytest.raises(ConfigError, match="missing column 'question'"):
        load_gsm8k(path, cache_dir=str(tmp_path / "c"))

    pref = _jsonl(tmp_path / "p.jsonl", [{"prompt": 7, "instruction": "1+1=", "good": "2", "bad": "3"}])
    ds = load_preference(pref, columns=("instruction", "good", "bad"), cache_dir=str(tmp_path / "c"))
    assert ds[0] == {"prompt": "1+1=", "chosen": "2", "rejected": "3"}


def test_validation_split_is_seeded_and_leaves_the_held_out_split_alone(tmp_path):
    train = _jsonl(tmp_path / "train.jsonl", ROWS)
    base = dict(name="gsm8k", train_path=train, num_eval=5, tokenizer_path=_tok(tmp_path), max_new_tokens=32)
    plain = build_task(TaskConfig(**base), str(tmp_path / "cache"))
    carved = build_task(TaskConfig(**base, val_fraction=0.2), str(tmp_path / "cache"))
    again = build_task(TaskConfig(**base, val_fraction=0.2), str(tmp_path / "cache"))
    assert plain.val is None and carved.eval.to_dict() == plain.eval.to_dict()
    assert (len(carved.train), len(carved.val)) == (20, 5) and carved.val.to_dict() == again.val.to_dict()
    assert not set(carved.val["prompt"]) & (set(carved.train["prompt"]) | set(carved.eval["prompt"]))
    assert set(carved.val["prompt"]) | set(carved.train["prompt"]) == set(plain.train["prompt"])
    other = build_task(TaskConfig(**base, val_fraction=0.2, data_seed=7), str(tmp_path / "cache"))
    assert other.val.to_dict() != carved.val.to_dict()

    val = _jsonl(tmp_path / "val.jsonl", ROWS[:4])
    from_file = build_task(TaskConfig(**base, val_path=val), str(tmp_path / "cache"))
    assert len(from_file.val) == 4 and from_file.train.to_dict() == plain.train.to_dict()
    with pytest.raises(ConfigError, match="task.val_fraction"):
        TaskConfig(**base, val_path=val, val_fraction=0.1)
    with pytest.raises(ConfigError, match=r"task.val_fraction=1.5 is invalid: expected None \(the task's default\) "
                                          r"or a number in \[0, 1\)"):
        TaskConfig(val_fraction=1.5)


def test_embedded_task_validation_share_leaves_the_held_out_split_alone(tmp_path):
    task = build_task(TaskConfig(num_train=300, num_eval=50, val_fraction=0), str(tmp_path))
    assert task.sft_validation is None and len(task.demonstrations) == 300  # every skill's rows (SFT's)
    carved = build_task(TaskConfig(num_train=300, num_eval=50, val_fraction=0.1), str(tmp_path))
    assert (len(carved.demonstrations), len(carved.sft_validation)) == (270, 30)
    assert carved.eval.to_dict() == task.eval.to_dict() and carved.retain_eval.to_dict() == task.retain_eval.to_dict()
    default = build_task(TaskConfig(num_train=400, num_eval=50), str(tmp_path))  # 2.5% by default
    assert (len(default.demonstrations), len(default.sft_validation)) == (390, 10)


# ---------------------------------------------------------------- length checks by algorithm
@pytest.mark.parametrize("algo", ["sft", "dpo"])
def test_answers_must_fit_the_budget_for_sft_and_dpo(tmp_path, algo):
    with pytest.raises(ConfigError, match=rf"task.max_new_tokens=3 is invalid: expected at least 5, the longest "
                                          rf"reference answer .* since algo={algo} trains on the answers"):
        build_task(TaskConfig(num_train=300, num_eval=50, max_new_tokens=3), str(tmp_path), algo=algo)


def test_grpo_does_not_need_the_answers_to_fit(tmp_path):
    task = build_task(TaskConfig(num_train=300, num_eval=50, max_new_tokens=3), str(tmp_path), algo="grpo")
    assert task.max_new_tokens == 3
    with pytest.raises(ConfigError, match="task.max_prompt_len=8 is invalid"):  # prompts still must fit
        build_task(TaskConfig(num_train=300, num_eval=50, max_prompt_len=8), str(tmp_path), algo="grpo")


# ---------------------------------------------------------------- rewards
SOLUTION = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
            "altogether in April and May.\n#### 72")


def test_gsm8k_reward_on_real_format_rows(tmp_path):
    path = _jsonl(tmp_path / "g.jsonl", [
        {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in "
                     "May. How many clips did Natalia sell altogether in April and May?", "answer": SOLUTION},
        {"question": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
                     "How much did she earn?", "answer": "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\n"
                                                         "Working 50 minutes, she earned 0.2 x 50 = $<<0.2*50=10>>10."
                                                         "\n#### 10"},
        {"question": "A big sum?", "answer": "It is 1,000 + 234 = 1,234.\n#### 1,234"},
    ])
    ds = load_gsm8k(path, cache_dir=str(tmp_path / "c"))
    assert ds["answer"] == ["72", "10", "1234"]
    for i, completion, want in [
        (0, " She sold 24 in May, so 48 + 24 = 72.\n#### 72", 1.0),
        (0, " In May 24, in total \\boxed{72}.", 1.0),
        (0, " The answer is $\\boxed{72.0}$ clips", 1.0),
        (0, " 48 + 24 = 72 clips altogether", 1.0),  # no marker: the last number
        (0, " 48 + 24 = 70\n#### 70", 0.0),
        (0, " \\boxed{70} (not 72)", 0.0),  # a box wins over later numbers
        (1, " She earned $10.\n#### $10", 1.0),
        (1, " \\boxed{\\$10.00}", 1.0),
        (2, " That makes \\boxed{1,234}", 1.0),
        (2, " #### 1234.0", 1.0),
        (2, " \\boxed{}", 0.0),
    ]:
        assert gsm8k_reward(completion, ds[i]["answer"]) == want, completion
    assert gsm8k_reward(SOLUTION, SOLUTION) == 1.0  # a whole solution as the reference


@pytest.mark.parametrize("spec, expected", [
    ("tests.helpers.rewards:missing", "could not be imported: AttributeError"),
    ("no_such_module.reward", "could not be imported: ModuleNotFoundError"),
    ("tests.helpers.rewards:NOT_CALLABLE", "is a int: expected a function"),
    ("tests.helpers.rewards:one_argument", "cannot be called as reward"),
    ("by_length", "expected package.module:function"),
])
def test_bad_reward_path_is_a_config_error_at_validate(tmp_path, spec, expected):
    with pytest.raises(ConfigError, match=re.escape(f"task.reward={spec!r}") + ".*" + re.escape(expected)):
        validate(compose_tiny_run(tmp_path, f"task.reward={spec}"))


def test_reward_hook_by_dotted_path_drives_grpo(tmp_path):
    assert load_reward("tests.helpers.rewards.by_length")("abc", "1") == 3.0
    run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, "sft.steps=0", "training.steps=2",
                    "task.reward=tests.helpers.rewards:by_length"))
    rows = read_metrics(tmp_path)
    n = 4 * 4  # prompts_per_step x group_size
    for r in rows[1:]:  # the mean of integer lengths up to max_new_tokens=6: beyond any [0, 1] reward
        assert 1.0 < r["reward/mean"] <= 6.0
        assert r["reward/mean"] * n == pytest.approx(round(r["reward/mean"] * n), abs=1e-4)


def test_reward_hook_that_raises_names_the_sample(tmp_path):
    with pytest.raises(Exception, match="sample 0.*KeyError: 'boom'"):
        run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, "sft.steps=0", "task.reward=tests.helpers.rewards:raises"))
    status = read_status(tmp_path)
    assert status["status"] == "failed" and "boom" in status["error"]
