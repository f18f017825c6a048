"""``task=preference``: DPO on a preference file alone (no reward, no verifier) from a pretrained checkpoint,
with held-out implicit-reward accuracy and margin on the evaluation schedule instead of task accuracy. The
checkpoint is tests/test_pretrained_start.py's tiny Qwen3 with a ChatML-shaped chat template."""

from __future__ import annotations

import json

import pytest

from refexp.config import ConfigError, TaskConfig
from refexp.config.root import to_object
from refexp.record.metrics import read_metrics
from refexp.run import run
from tests.helpers.configs import compose_root, compose_tiny_run
from tests.helpers.tiny_qwen3 import MODEL, QUESTIONS

transformers = pytest.importorskip("transformers")


def _answer(solution: str) -> str:
    return solution.rsplit("#### ", 1)[1]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """Standard format: prompt/chosen/rejected strings, the right and a wrong final number."""
    path = tmp_path_factory.mktemp("pref") / "pairs.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Question: {q}\nAnswer:", "chosen": f" {_answer(a)}",
                                        "rejected": f" {int(_answer(a)) + 1}"}) + "\n" for q, a in QUESTIONS))
    return path


@pytest.fixture(scope="module")
def chat_pairs(tmp_path_factory):
    """TRL's conversational format: prompt/chosen/rejected as lists of messages."""
    path = tmp_path_factory.mktemp("pref_chat") / "pairs.jsonl"
    path.write_text("".join(json.dumps({
        "prompt": [{"role": "user", "content": q}],
        "chosen": [{"role": "assistant", "content": _answer(a)}],
        "rejected": [{"role": "assistant", "content": str(int(_answer(a)) + 1)}]}) + "\n" for q, a in QUESTIONS))
    return path


def _dpo(run_dir, hf_dir, pairs, *extra):
    return compose_tiny_run(
        run_dir, *MODEL, f"model.hf_assets_path={hf_dir}", "sft.enable=false",
        "task=preference", f"task.preference_path={pairs}", "task.num_eval=4", "task.max_prompt_len=128",
        "task.max_new_tokens=8", "algo=dpo", "algo.pairs_per_step=4", "training.steps=2", "training.lr=1e-3",
        "eval.num_prompts=4", "eval.kl_prompts=2", *extra)


def _check_eval_rows(rows):
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in (rows[0], rows[2]):  # eval.every=2: step 0 and the end
        assert 0.0 <= r["eval/pref_accuracy"] <= 1.0 and "eval/pref_margin" in r and "kl/init" in r
    assert all("eval/accuracy" not in r and "eval/logp_correct" not in r for r in rows)
    assert "eval/pref_accuracy" not in rows[1]
    # at step 0 the policy is the fixed reference: every implicit reward is 0, so no pair is won
    assert rows[0]["eval/pref_margin"] == pytest.approx(0.0, abs=1e-5)
    assert rows[0]["eval/pref_accuracy"] == 0.0
    assert rows[0]["kl/init"] == pytest.approx(0.0, abs=1e-6)


def test_dpo_on_a_preference_file_logs_heldout_pair_metrics(hf_dir, pairs, tmp_path):
    run_dir = tmp_path / "run"
    final = run(_dpo(run_dir, hf_dir, pairs))
    _check_eval_rows(read_metrics(run_dir))
    assert "eval/pref_accuracy" in final and "eval/accuracy" not in final


def test_reference_free_loss_uses_its_own_implicit_reward(hf_dir, pairs, tmp_path):
    run_dir = tmp_path / "run"
    run(_dpo(run_dir, hf_dir, pairs, "reference=none", "algo.loss_type=simpo", "training.steps=1"))
    rows = read_metrics(run_dir)
    # SimPO's reward is beta times the mean token log-prob: nonzero from the start, unlike DPO's
    assert rows[0]["eval/pref_margin"] != 0.0 and "kl/ref" not in rows[0]


def test_conversational_pairs_render_with_the_chat_template(hf_dir, chat_pairs, tmp_path):
    from refexp.tasks import build_task

    cfg = to_object(_dpo(tmp_path / "run", hf_dir, chat_pairs, "task.chat_template=true"))
    task = build_task(cfg.task, str(tmp_path / "cache"), algo="dpo")
    theirs = transformers.AutoTokenizer.from_pretrained(hf_dir)
    rows = {r["prompt"]: r for r in [*task.train, *task.eval]}
    assert len(rows) == len(QUESTIONS) and len(task.eval) == 4
    for q, a in QUESTIONS:
        prompt = theirs.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                            add_generation_prompt=True)
        assert rows[prompt]["chosen"] == f"{_answer(a)}<|im_end|>\n"

    run_dir = tmp_path / "run"
    run(_dpo(run_dir, hf_dir, chat_pairs, "task.chat_template=true"))
    _check_eval_rows(read_metrics(run_dir))


def test_heldout_pairs_from_eval_path(hf_dir, pairs, chat_pairs, tmp_path):
    from refexp.tasks import build_task

    cfg = to_object(_dpo(tmp_path / "run", hf_dir, pairs, f"task.eval_path={chat_pairs}"))
    task = build_task(cfg.task, str(tmp_path / "cache"), algo="dpo")
    assert len(task.train) == len(task.eval) == len(QUESTIONS)
    assert task.eval[0]["prompt"].startswith("<|im_start|>user")


def test_config_errors_name_task_and_algo(hf_dir, pairs):
    start = ["task=preference", f"task.preference_path={pairs}", f"model.hf_assets_path={hf_dir}"]
    for algo in ("grpo", "sft"):
        with pytest.raises(ConfigError, match=f"task=preference is invalid with algo={algo}"):
            to_object(compose_root(*start, f"algo={algo}", "sft.enable=false"))
    with pytest.raises(ConfigError, match="task=preference needs sft.enable=false"):
        to_object(compose_root(*start, "algo=dpo"))
    with pytest.raises(ConfigError, match="task.preference_path"):
        TaskConfig(name="preference")
    for field, value in (("train_path", "x.jsonl"), ("reward", "m:f"), ("val_fraction", 0.1)):
        with pytest.raises(ConfigError, match=f"task.{field}"):
            TaskConfig(name="preference", preference_path="p.jsonl", **{field: value})


@pytest.mark.slow
def test_dpo_on_a_preference_file_under_fsdp(hf_dir, pairs, tmp_path):
    """2 FSDP ranks split the held-out pairs and kl prompts (odd counts: one rank pads its share) and log
    the single-process numbers: eval/pref_*, kl/init, and kl/ref against a moving (EMA) reference."""
    odd = ("task.num_eval=5", "eval.num_prompts=5", "eval.kl_prompts=3", "reference=ema", "reference.alpha=0.5")
    run_dir = tmp_path / "run"
    final = run(_dpo(run_dir, hf_dir, pairs, *odd, "parallelism=fsdp", "parallelism.nproc_per_node=2"))
    assert final["step"] == 2
    two = read_metrics(run_dir)
    _check_eval_rows(two)
    run(_dpo(tmp_path / "one", hf_dir, pairs, *odd))
    one = read_metrics(tmp_path / "one")
    keys = ("eval/pref_accuracy", "eval/pref_margin", "kl/init", "kl/ref", "logps/chosen_delta")
    for got, want in zip(two[::2], one[::2]):  # the eval steps 0 and 2
        assert {k: got[k] for k in keys} == pytest.approx({k: want[k] for k in keys}, abs=1e-5)
    assert one[-1]["kl/ref"] > 1e-6 and one[-1]["eval/pref_margin"] != 0.0  # not a comparison of zeros
