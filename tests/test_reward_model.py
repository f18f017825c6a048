"""Learned rewards (docs/reward-models.md): ``algo=rm`` trains and exports a reward model, ``task.reward_model``
loads it as GRPO's reward with the verifier's ``reward/gold`` beside it; the scorer against transformers called
directly; weighted reward sums; the checks that name the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from refexp.config import ConfigError, TaskConfig
from refexp.config.root import to_object
from refexp.record.metrics import read_metrics
from refexp.record.outcomes import read_outcomes
from refexp.record.samples import read_samples
from refexp.run import run
from refexp.tasks.reward_sum import with_rewards
from refexp.tasks.rewards import exact_match_reward
from tests.helpers.configs import SMALL_GRPO_OVERRIDES, compose_root, compose_small_run, compose_tiny_run
from tests.helpers.runs import assert_same_metrics

transformers = pytest.importorskip("transformers")

# 4 steps on 64 labelled samples: the mechanics, not a good reward model
RM_STAGE = ["rm.num_samples=64", "rm.samples_per_prompt=4", "rm.steps=4", "rm.batch_size=16", "rm.eval_every=2"]
RM_OVERRIDES = ["algo=rm", *RM_STAGE]


@pytest.fixture(scope="module")
def small_rm(tmp_path_factory):
    """``algo=rm`` on the small run's SFT model: (its final metrics, its run dir)."""
    run_dir = tmp_path_factory.mktemp("rm") / "run"
    with pytest.MonkeyPatch.context() as mp:  # the session's cache (tests/conftest.py), set before this fixture runs
        mp.setenv("REFEXP_CACHE", str(tmp_path_factory.getbasetemp() / "refexp-cache"))
        return run(compose_small_run(run_dir, *RM_OVERRIDES)), run_dir


def _score_directly(rm_dir, prompts, completions) -> list[float]:
    """The reward model's logit of BOS + prompt + completion, one text at a time, through transformers alone."""
    model = transformers.AutoModelForSequenceClassification.from_pretrained(rm_dir).eval()
    tok = transformers.AutoTokenizer.from_pretrained(rm_dir)
    out = []
    with torch.no_grad():
        for p, c in zip(prompts, completions):
            ids = [tok.bos_token_id] + tok(p + c, add_special_tokens=False)["input_ids"]
            out.append(float(model(torch.tensor([ids])).logits[0, 0]))
    return out


def test_a_trained_reward_model_is_grpos_reward_and_the_verifier_its_gold(small_rm, tmp_path):
    final, rm_run = small_rm
    rm_dir = final["rm/dir"]
    config = transformers.AutoConfig.from_pretrained(rm_dir)
    assert config.architectures == ["LlamaForSequenceClassification"] and config.num_labels == 1
    assert 0 < final["rm/positive_rate"] < 1  # the SFT model gets some right: both labels to learn from
    assert [r["step"] for r in read_metrics(rm_run)] == [1, 2, 3, 4]  # the stage's curve in the run

    run_dir = tmp_path / "grpo"
    run(compose_small_run(run_dir, *SMALL_GRPO_OVERRIDES, "training.steps=3", f"task.reward_model={rm_dir}"))
    rows = {r["step"]: r for r in read_metrics(run_dir)}
    assert sorted(rows) == [0, 1, 2, 3]
    for step in (1, 2, 3):
        assert {"reward/mean", "reward/gold"} <= rows[step].keys()
    for step in (0, 2):  # the evaluations (eval.every=2) hold the held-out gold beside the proxy
        assert {"eval/accuracy", "eval/gold"} <= rows[step].keys()
    # the validation split's per-prompt proxy and gold too: what comparison.select.budget reads a subset of
    outcomes = {(step, o.split, o.metric): o for step, o in read_outcomes(run_dir)}
    for step in (0, 2):
        for metric in ("val/accuracy", "val/gold"):
            o = outcomes[(step, "val", metric)]
            assert o.prompt_ids == list(range(len(o.scores))) and len(o.scores) > 0
            assert sum(o.scores) / len(o.scores) == pytest.approx(rows[step][metric], rel=1e-12)

    # the logged rewards are the reward model's logits, the gold the verifier's exact match, sample by sample
    rollouts = [s for s in read_samples(run_dir, "rollout") if s["step"] == 2]
    assert rollouts
    prompts, completions = [s["prompt"] for s in rollouts], [s["completion"] for s in rollouts]
    for s, want in zip(rollouts, _score_directly(rm_dir, prompts, completions)):
        assert s["reward"] == pytest.approx(want, abs=1e-4)
        assert s["gold"] == exact_match_reward(s["completion"], s["answer"])
    assert len({round(s["reward"], 6) for s in rollouts}) > 1  # a score per text, not a constant
    held_out = [s for s in read_samples(run_dir, "eval") if s["step"] == 2]
    for s, want in zip(held_out, _score_directly(rm_dir, [s["prompt"] for s in held_out],
                                                 [s["completion"] for s in held_out])):
        assert s["reward"] == pytest.approx(want, abs=1e-4)

    # without a learned reward: no gold, and the reward is the verifier's exact match
    plain = tmp_path / "plain"
    run(compose_small_run(plain, *SMALL_GRPO_OVERRIDES, "training.steps=3"))
    assert not any(k.endswith("/gold") for r in read_metrics(plain) for k in r)
    for s in read_samples(plain, "rollout"):
        assert "gold" not in s and s["reward"] == exact_match_reward(s["completion"], s["answer"])

    # task.reward_model=rm names the stage's model of the run's own rm settings: the same cached dir, the same run
    by_name = tmp_path / "by_name"
    run(compose_small_run(by_name, *SMALL_GRPO_OVERRIDES, "training.steps=3", "task.reward_model=rm", *RM_STAGE))
    assert_same_metrics(by_name, run_dir, other_order=False)


def test_a_cached_reward_model_is_reused(small_rm, tmp_path):
    final, _ = small_rm
    rm_json = json.loads((Path(final["rm/dir"]).parent / "rm.json").read_text())
    again = run(compose_small_run(tmp_path / "again", *RM_OVERRIDES))
    assert again["rm/dir"] == final["rm/dir"]
    assert json.loads((Path(again["rm/dir"]).parent / "rm.json").read_text()) == rm_json  # not trained again
    weaker = run(compose_small_run(tmp_path / "weaker", *RM_OVERRIDES, "rm.num_samples=32"))
    assert weaker["rm/dir"] != final["rm/dir"]  # the number of labelled samples is in the key


def test_without_a_learned_reward_the_task_scores_with_its_verifier(tmp_path):
    from refexp.tasks import build_task

    cfg = TaskConfig(num_train=50, num_eval=10)
    task = build_task(cfg, str(tmp_path), algo="grpo")
    task = with_rewards(task, cfg)
    assert task.optimised is None and task.gold is None
    texts, answers = ["0359", "12"], ["359", "12"]
    assert task.score(texts, answers, ["a", "b"]) == task.verify(texts, answers, ["a", "b"]) == [1.0, 1.0]
    assert task.gold_score(texts, answers, ["a", "b"]) is None


def test_reward_funcs_are_summed_with_their_weights(tmp_path):
    from refexp.tasks import build_task

    cfg = TaskConfig(num_train=50, num_eval=10, reward_funcs=["verifier", "tests.helpers.rewards:by_length"],
                     reward_weights=[2.0, 0.5])
    task = build_task(cfg, str(tmp_path), algo="grpo")
    task = with_rewards(task, cfg)
    texts, answers = ["0359", "12345", ""], ["359", "7", "1"]
    assert task.score(texts, answers, ["p"] * 3) == [2.0 + 0.5 * 4, 0.5 * 5, 0.0]
    assert task.gold_score(texts, answers, ["p"] * 3) == [1.0, 0.0, 0.0]  # the verifier alone


@pytest.fixture(scope="module")
def chat_rm(hf_dir, tmp_path_factory):
    """A one-label Qwen3 sequence classifier with the tiny Qwen3's tokenizer and chat template."""
    out = tmp_path_factory.mktemp("chat_rm") / "rm"
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    config = transformers.AutoConfig.from_pretrained(hf_dir, num_labels=1, pad_token_id=tok.pad_token_id)
    torch.manual_seed(1)
    transformers.Qwen3ForSequenceClassification(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_a_chat_template_renders_prompt_and_completion_and_batches_score_as_single_texts(chat_rm):
    from refexp.tasks.reward_model import RewardModel

    prompts, completions = ["Tom has 3 apples.", "How many?"], ["He has 5 apples.\n#### 5", "7"]
    rm = RewardModel(str(chat_rm), field_name="task.reward_model", batch_size=2)
    got = rm(prompts, completions)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(chat_rm).eval()
    tok = transformers.AutoTokenizer.from_pretrained(chat_rm)
    want = []
    with torch.no_grad():
        for p, c in zip(prompts, completions):
            text = tok.apply_chat_template([{"role": "user", "content": p}, {"role": "assistant", "content": c}],
                                           tokenize=False)
            assert "<|im_start|>assistant" in text
            want.append(float(model(**tok(text, return_tensors="pt", add_special_tokens=False)).logits[0, 0]))
    assert got == pytest.approx(want, abs=1e-5)  # two texts of other lengths in one padded batch
    assert RewardModel(str(chat_rm), field_name="x", batch_size=2, offload=True)(prompts, completions) == \
        pytest.approx(want, abs=1e-5)


def test_bad_reward_model_dirs_are_named_before_any_model_is_built(hf_dir, chat_rm, tmp_path):
    from refexp.tasks.sources import check_sources

    with pytest.raises(ConfigError, match=r"task.reward_model='/nonexistent' is not a directory"):
        check_sources(TaskConfig(reward_model="/nonexistent"))
    with pytest.raises(ConfigError, match=r"task.reward_model=.* is not a sequence-classification checkpoint"):
        check_sources(TaskConfig(reward_model=str(hf_dir)))  # a causal LM
    two = tmp_path / "two"
    two.mkdir()
    config = json.loads((chat_rm / "config.json").read_text())
    config["id2label"], config["num_labels"] = {"0": "a", "1": "b"}, 2
    (two / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"task.gold_reward_model=.* has num_labels=2: expected 1"):
        check_sources(TaskConfig(gold_reward_model=str(two)))
    with pytest.raises(ConfigError, match=r"task.reward_funcs\[\]=.* is not a directory"):
        check_sources(TaskConfig(reward_funcs=["verifier", "/nonexistent/rm"]))
    with pytest.raises(ConfigError, match=r"task.reward_funcs\[\]='tests.helpers.rewards:nope' could not be imported"):
        check_sources(TaskConfig(reward_funcs=["tests.helpers.rewards:nope"]))
    with pytest.raises(ConfigError, match=r"task.reward_weights=\[1.0\] is invalid"):
        TaskConfig(reward_funcs=["verifier", "tests.helpers.rewards:by_length"], reward_weights=[1.0])
    with pytest.raises(ConfigError, match=r"task.reward_model is invalid with algo=dpo"):
        to_object(compose_root("algo=dpo", f"task.reward_model={chat_rm}"))
    with pytest.raises(ConfigError, match=r"parallelism.nproc_per_node=2 is invalid with algo=rm"):
        to_object(compose_root("algo=rm", "parallelism=fsdp", "parallelism.nproc_per_node=2"))


def test_a_reward_model_dir_without_its_head_or_any_weights_is_refused_before_any_build(hf_dir, chat_rm, tmp_path):
    """A causal LM's export with a classifier's config.json would load with a random score head (transformers
    only warns, and refexp silences it); a config with no weight file at all is refused too."""
    import shutil

    from refexp.tasks.sources import check_sources

    check_sources(TaskConfig(reward_model=str(chat_rm)))  # the head is there
    headless = tmp_path / "headless"
    shutil.copytree(hf_dir, headless)
    (headless / "config.json").write_text((chat_rm / "config.json").read_text())
    with pytest.raises(ConfigError, match=r"task.reward_model=.*headless.* has no weights for its classifier head "
                                          r"\(score.weight\)"):
        check_sources(TaskConfig(reward_model=str(headless)))
    bare = tmp_path / "bare"
    shutil.copytree(chat_rm, bare, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    with pytest.raises(ConfigError, match=r"task.gold_reward_model=.*bare.* has no weight files \(model.safetensors"):
        check_sources(TaskConfig(gold_reward_model=str(bare)))


def test_the_dry_run_plan_counts_the_reward_model(chat_rm):
    from refexp.cli.dry_run import dry_run
    from refexp.tasks.reward_model import reward_model_parameters

    n = reward_model_parameters(str(chat_rm))
    model = transformers.AutoModelForSequenceClassification.from_pretrained(chat_rm)
    assert n == sum(p.numel() for p in model.parameters())
    plan = dry_run(compose_root("algo=grpo", f"task.reward_model={chat_rm}", "dry_run=true"))
    assert plan["reward models"] == n * 4
    offloaded = dry_run(compose_root("algo=grpo", f"task.reward_model={chat_rm}", "task.reward_model_offload=true",
                                     "task.reward_model_dtype=bfloat16", "dry_run=true"))
    assert offloaded["reward models"] == 0
    assert "reward models" not in dry_run(compose_root("algo=grpo", "dry_run=true"))


def test_gsm8k_from_a_pretrained_checkpoint_optimises_a_chat_reward_model(hf_dir, chat_rm, tmp_path):
    """task=gsm8k on the tiny Qwen3 with its chat template: the reward model reads the rendered prompt + completion
    (not templated twice), and the gold is the GSM8K verifier."""
    from refexp.tasks.rewards import gsm8k_reward
    from tests.helpers.tiny_qwen3 import MODEL, QUESTIONS

    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in QUESTIONS))
    run_dir = tmp_path / "run"
    run(compose_tiny_run(
        run_dir, *MODEL, f"model.hf_assets_path={hf_dir}", "sft.enable=false", "task=gsm8k",
        f"task.train_path={data}", f"task.eval_path={data}", "task.chat_template=true", "task.max_prompt_len=128",
        "task.max_new_tokens=8", "algo=grpo", "algo.prompts_per_step=2",
        "algo.group_size=2", "training.steps=2", "eval.num_prompts=4", "eval.kl_prompts=2",
        f"task.reward_model={chat_rm}"))
    rows = {r["step"]: r for r in read_metrics(run_dir)}
    assert {"reward/mean", "reward/gold"} <= rows[2].keys() and "eval/gold" in rows[2]
    rollouts = [s for s in read_samples(run_dir, "rollout") if s["step"] == 2]
    model = transformers.AutoModelForSequenceClassification.from_pretrained(chat_rm).eval()
    tok = transformers.AutoTokenizer.from_pretrained(chat_rm)
    for s in rollouts:
        assert s["prompt"].startswith("<|im_start|>user")  # rendered by the policy's template
        ids = tok(s["prompt"] + s["completion"], add_special_tokens=False, return_tensors="pt")
        with torch.no_grad():
            assert s["reward"] == pytest.approx(float(model(**ids).logits[0, 0]), abs=1e-4)
        assert s["gold"] == gsm8k_reward(s["completion"], s["answer"])


def test_the_dry_run_counts_the_stage_model_at_the_policys_shape():
    from refexp.cli.dry_run import dry_run

    plan = dry_run(compose_root("algo=grpo", "task.reward_model=rm", "dry_run=true"))
    assert plan["reward models"] == plan["parameters"]  # float32 both, one process: P x 4 bytes
