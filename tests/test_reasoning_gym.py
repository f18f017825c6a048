"""``task=reasoning_gym`` (refexp/tasks/reasoning_gym.py, reasoning_gym_splits.py): disjoint splits, the dataset's
own scorer as the reward, prompts through the tokenizer's chat template, and the errors of a bad name or a
missing install."""

from __future__ import annotations

import json
import sys

import pytest

from refexp.config import ConfigError, TaskConfig
from refexp.record.metrics import read_metrics
from refexp.record.samples import read_samples
from refexp.run import run
from refexp.tasks import build_task
from refexp.tasks import reasoning_gym as gym
from refexp.tasks.tokenizer import TextTokenizer
from tests.helpers.configs import compose_root, compose_tiny_run
from tests.helpers.tiny_qwen3 import MODEL

reasoning_gym = pytest.importorskip("reasoning_gym", reason="the optional extra pip install -e '.[gym]' (in .[test])")

# One-digit sums of two terms: a space of a few hundred questions, so distinct seeds repeat questions and only the
# de-duplication keeps the splits apart.
SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


@pytest.fixture(scope="module")
def tokenizer_dir(hf_dir):
    """The tiny Qwen3's dir (tests/conftest.py): a byte-level BPE tokenizer with a ChatML-shaped chat template."""
    return str(hf_dir)


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


def test_a_config_whose_generator_never_returns_is_refused_in_one_line(monkeypatch):
    """base_conversion with min_base == max_base redraws its target base forever: the first question's generation
    is timed out and the config named, instead of a run that hangs before its first step."""
    import threading

    release = threading.Event()

    class Stuck:  # reasoning-gym's own loop would spin on a core for the rest of the session: this one waits
        def __getitem__(self, i):
            release.wait()
            return {"question": "?"}

    try:
        with pytest.raises(ConfigError, match=r"task\.dataset='base_conversion' with config .* did not generate one"):
            gym.first_item(Stuck(), "base_conversion", {"min_base": 5, "max_base": 5}, field="task.dataset",
                           timeout_s=0.5)
    finally:
        release.set()
    ds = gym.create("base_conversion", {}, seed=0, size=2)
    assert gym.first_item(ds, "base_conversion", {}, field="task.dataset") == ds[0]
    with pytest.raises(ZeroDivisionError):  # a generator's own error is the caller's

        class Raises:
            def __getitem__(self, i):
                return 1 / 0

        gym.first_item(Raises(), "x", {}, field="task.dataset")


def test_the_reward_is_the_datasets_own_scorer_on_the_tagged_answer(tokenizer_dir, tmp_path):
    task = build_task(_cfg(tokenizer_dir, dataset="basic_arithmetic", retention_datasets=["chain_sum"]),
                      str(tmp_path))
    for rows, name, kwargs in ((task.eval, "basic_arithmetic", SMALL), (task.retain_eval, "chain_sum", {})):
        record = json.loads(rows["answer"][0])
        # the record names its entry: item `index` of the dataset of `seed`, regenerated here by reasoning-gym
        scorer = reasoning_gym.create_dataset(name, seed=record["seed"], size=record["index"] + 1, **kwargs)
        entry = scorer[record["index"]]
        oracle = entry["answer"]
        assert (record["dataset"], record["answer"], entry["question"]) == (name, oracle, rows["question"][0])
        # correct; wrong but containing the oracle (basic_arithmetic's scorer gives partial credit, chain_sum's
        # compares numbers); wrong; untagged (reasoning-gym's extraction finds no answer)
        for completion, answer in ((f"so <answer>{oracle}</answer>", oracle),
                                   (f"<answer>{oracle}0</answer>", oracle + "0"), ("<answer>x</answer>", "x"),
                                   (oracle, None)):
            want = scorer.score_answer(answer, entry)
            assert task.reward(completion, rows["answer"][0]) == want, (completion, want)
        assert task.reward(f"<answer>{oracle}</answer>", rows["answer"][0]) == 1.0
    partial = json.loads(task.eval["answer"][0])["answer"]
    assert 0 < task.reward(f"<answer>{partial}0</answer>", task.eval["answer"][0]) < 1  # the scorer's partial credit


def test_the_reward_scores_the_entry_as_drawn_not_a_json_copy(tokenizer_dir, tmp_path):
    """arc_agi's scorer reads tuples from the metadata, which JSON gives back as lists: its own oracle would score
    0.05 from a JSON copy of the entry."""
    task = build_task(_cfg(tokenizer_dir, dataset="arc_agi", dataset_kwargs={}, num_train=2, num_eval=2,
                           val_fraction=0, retention_datasets=[], chat_template=False, system_prompt=None,
                           max_prompt_len=100000), str(tmp_path), algo="grpo")
    for row in task.eval:
        assert task.reward(f"<answer>{json.loads(row['answer'])['answer']}</answer>", row["answer"]) == 1.0


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


# The command docs/own-data.md gives (model=smollm2_135m: model.pretrained, fetched and converted by the run).
DOCUMENTED_GYM = ["algo=grpo", "model=smollm2_135m", "task=reasoning_gym", "task.dataset=basic_arithmetic"]
ONE_DIGIT_PRODUCTS = {"name": "products", "min_digits": 1, "max_digits": 1}  # the task's default retained skill


def test_the_documented_command_fits_the_default_sizes_to_the_default_retained_skill(capsys):
    """One-digit products hold 100 questions; the defaults ask 200 retained test rows (task.num_eval) and 50
    retained validation rows (2.5% of 2,000): the two get what the dataset holds, 80 and 20 (the proportion asked),
    each question in one split, and the run says so."""
    from refexp.config import to_object
    from refexp.tasks.data_checks import check_task_data
    from refexp.tasks.reasoning_gym_splits import drawn

    cfg = to_object(compose_root(*DOCUMENTED_GYM))
    assert (cfg.task.num_eval, list(cfg.task.retention_datasets)) == (200, [ONE_DIGIT_PRODUCTS])
    check_task_data(cfg)
    retained = drawn(cfg.task).retained
    assert (len(retained["retain_eval"]), len(retained["retain_val"])) == (80, 20)
    questions = list(retained["retain_eval"]["question"]) + list(retained["retain_val"]["question"])
    assert len(set(questions)) == 100
    assert "holds 100 distinct questions, fewer than the 250 asked" in capsys.readouterr().out


def test_a_retained_dataset_too_small_for_a_row_per_split_is_refused():
    from refexp.tasks.reasoning_gym_splits import fit_shares

    row = {"question": "q"}
    assert fit_shares([row] * 5, {"retain_eval": 8, "retain_val": 2}, ONE_DIGIT_PRODUCTS) == ([row] * 4, [row])
    assert fit_shares([row] * 2, {"retain_eval": 9, "retain_val": 1}, ONE_DIGIT_PRODUCTS) == ([row], [row])
    assert fit_shares([row] * 3, {"retain_eval": 9, "retain_val": 0}, ONE_DIGIT_PRODUCTS) == ([row] * 3, [])
    with pytest.raises(ConfigError, match=r"task.retention_datasets\[\]=.*products.* is too small to measure "
                                          r"retention: its draws found 1 distinct question"):
        fit_shares([row], {"retain_eval": 9, "retain_val": 1}, ONE_DIGIT_PRODUCTS)


@pytest.fixture
def fetches(monkeypatch) -> list[str]:
    """``model.pretrained`` fetches asked for (each refused: none may happen in these tests)."""
    asked: list[str] = []

    def fetch(name, cache_dir):
        asked.append(name)
        raise AssertionError(f"model.pretrained={name} fetched")

    monkeypatch.setattr("refexp.components.pretrained.ensure_pretrained", fetch)
    return asked


def test_splits_too_large_for_the_dataset_are_refused_before_the_model_is_fetched(tmp_path, fetches):
    tiny = "+task.dataset_kwargs={min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1, operators: ['+'], " \
           "allow_negation: false, allow_parentheses: false}"
    cfg = compose_root(*DOCUMENTED_GYM, tiny, "task.num_train=500", f"run_dir={tmp_path}")
    with pytest.raises(ConfigError, match="task.dataset='basic_arithmetic'.*too small"):
        run(cfg)
    assert fetches == []


NO_ANSWERS = "graph_color"
"""A reasoning-gym dataset whose entries' answer is None (reasoning-gym 0.1.25; also propositional_logic,
rubiks_cube, rush_hour, boxnet): puzzles of many valid solutions, which its scorer checks on their own."""


def test_a_dataset_without_answers_has_no_demonstration_but_its_scorer_rewards(tokenizer_dir, tmp_path):
    task = build_task(_cfg(tokenizer_dir, dataset=NO_ANSWERS, dataset_kwargs={}, num_train=8, num_eval=4,
                           retention_datasets=[], max_new_tokens=512), str(tmp_path), algo="grpo")
    assert all(json.loads(a)["answer"] is None for a in task.train["answer"])
    assert set(task.train["completion"]) == {None}  # never the text "<answer>None</answer>"
    assert task.reward("<answer>None</answer>", task.train["answer"][0]) == 0.0


@pytest.mark.parametrize("overrides, trains", [
    (["algo=sft"], "the SFT stage"),
    (["algo=grpo"], "the SFT stage"),  # the start every algorithm trains first
    (["algo=dpo", "sft.enable=false"], "algo=dpo would take them as the chosen side"),
    (["algo=grpo", "sft.enable=false", "grpo_variant=continued_sft"], "algo.objective=continued_sft"),
])
def test_training_on_a_dataset_without_answers_is_refused_in_one_line_before_the_model_is_fetched(
        overrides, trains, tmp_path, fetches):
    cfg = compose_root("model=smollm2_135m", "sft.enable=true", "task=reasoning_gym", f"task.dataset={NO_ANSWERS}",
                       *overrides, f"run_dir={tmp_path}")
    with pytest.raises(ConfigError) as refused:
        run(cfg)
    message = str(refused.value)
    assert message.startswith(f"task.dataset='{NO_ANSWERS}' has no reference answers to train on")
    assert "\n" not in message  # `refexp: error: <message>`, one line
    assert trains in message
    assert fetches == []


def test_grpo_from_a_start_without_demonstrations_scores_a_dataset_without_answers():
    from refexp.config import to_object
    from refexp.tasks.data_checks import check_task_data

    check_task_data(to_object(compose_root(*DOCUMENTED_GYM, f"task.dataset={NO_ANSWERS}")))  # sft.enable=false


@pytest.mark.slow
def test_grpo_on_a_reasoning_gym_dataset_logs_reward_retention_and_readable_samples(hf_dir, tmp_path):
    run_dir = tmp_path / "run"
    cfg = compose_tiny_run(
        run_dir, *MODEL, f"model.hf_assets_path={hf_dir}", "sft.enable=false", "task=reasoning_gym",
        "task.dataset=chain_sum", "+task.dataset_kwargs={min_terms: 2, max_terms: 2, max_digits: 1}",
        "task.retention_datasets=[{name: basic_arithmetic, min_terms: 2, max_terms: 2, max_digits: 1}]",
        "task.system_prompt=''", "task.num_train=40", "task.num_eval=8", "task.max_prompt_len=200",
        "task.max_new_tokens=8", "algo=grpo", "algo.prompts_per_step=2", "algo.group_size=2", "training.steps=2",
        "eval.num_prompts=4", "eval.kl_prompts=2", "eval.log_samples=2")
    final = run(cfg)
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2] and final["step"] == 2
    assert all(0.0 <= r["reward/mean"] <= 1.0 for r in rows[1:])
    for key in ("eval/accuracy", "eval/retention", "kl/init", "kl/init_retain"):
        assert key in rows[0] and key in rows[-1], key
    samples = read_samples(run_dir)
    assert samples and all(s["prompt"].startswith("<|im_start|>user\n") for s in samples)
    assert all(json.loads(s["answer"])["dataset"] == "chain_sum" for s in samples)
