"""Validation that keeps its promise: infinite floats, options the chosen task ignores, prompt + generation
longer than ``model.max_seq_len``, and empty data files each fail with one line naming the field or file,
before any model is built (the config-level ones before torch is imported)."""

from __future__ import annotations

import subprocess
import sys

import datasets
import pytest

from refexp.config import ConfigError, TaskConfig, to_object
from refexp.config.errors import INFINITY_MEANS_SOMETHING
from tests.helpers.configs import compose_root

GRPO = ["algo=grpo", "reference=fixed"]

# Prints, at exit, whether torch was imported by then: the config checks run in `precheck` before it.
_CLI = ("import atexit, sys\n"
        "atexit.register(lambda: print('torch imported:', 'torch' in sys.modules, file=sys.stderr))\n"
        "from refexp.__main__ import main\n"
        "sys.argv = ['refexp', *sys.argv[1:]]\n"
        "main()\n")


@pytest.mark.parametrize("overrides, prefix", [
    ([*GRPO, "algo.beta=inf"], "algo.beta=inf is invalid: expected a finite number"),
    ([*GRPO, "training.lr=inf"], "training.lr=inf is invalid: expected a finite number"),
    (["algo=dpo", "reference=fixed", "algo.beta=nan"], "algo.beta=nan is invalid"),
    ([*GRPO, "task.train_path=train.jsonl"],
     "task.train_path='train.jsonl' is invalid: expected None (its default) with task.name=arithmetic"),
    ([*GRPO, "model=tiny", "task.max_new_tokens=60"],
     "task.max_new_tokens=60 is invalid with model.max_seq_len=64: expected at most 55 (a prompt of task.digits=3 "
     "is 9 tokens"),
    ([*GRPO, "model=tiny", "algo.max_new_tokens=56"], "algo.max_new_tokens=56 is invalid with model.max_seq_len=64"),
    (["algo=grpo", "reference=none", "algo.objective=sft"],  # refexp/choices.py: RENAMED_CHOICES
     "algo.objective='sft' is invalid: expected one of grpo, continued_sft (sft was renamed to continued_sft)"),
])
def test_bad_values_are_one_line_exit_2_before_torch(tmp_path, overrides, prefix):
    out = subprocess.run([sys.executable, "-c", _CLI, *overrides, "logger=none", f"hydra.run.dir={tmp_path}"],
                         capture_output=True, text=True, timeout=120)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2, out.stderr
    assert lines == [lines[0], "torch imported: False"] and lines[0].startswith(f"refexp: error: {prefix}"), out.stderr
    assert not list(tmp_path.iterdir())  # nothing written


def test_infinity_passes_only_where_it_means_something():
    assert to_object(compose_root(*GRPO, "training.max_norm=inf")).training.max_norm == float("inf")
    assert to_object(compose_root(*GRPO, "algo.eps_high=inf", "algo.tis_cap=inf")).algo.eps_high == float("inf")
    with pytest.raises(ConfigError, match=r"training.max_norm=nan is invalid"):
        to_object(compose_root(*GRPO, "training.max_norm=nan"))
    for field in ("reference.kl_threshold", "sft.lr", "task.demo_slip"):
        option = ["reference=kl_triggered"] if field.startswith("reference") else []
        with pytest.raises(ConfigError, match=rf"{field}=inf is invalid"):
            to_object(compose_root(*GRPO, *option, f"{field}=inf"))
    assert set(INFINITY_MEANS_SOMETHING) == {"training.max_norm", "algo.eps_low", "algo.eps_high", "algo.tis_cap"}


@pytest.mark.parametrize("task, override", [
    (["task=arithmetic"], "task.eval_path=e.jsonl"),
    (["task=arithmetic"], "task.val_path=v.jsonl"),
    (["task=arithmetic"], "task.question_column=q"),
    (["task=arithmetic"], "task.prompt_column=p"),  # no task.preference_path
    (["task=arithmetic"], "task.dataset_config=main"),
    (["task=arithmetic"], "task.train_split=other"),
    (["task=arithmetic"], "task.eval_split=other"),
    (["task=gsm8k", "task.train_path=t.jsonl"], "task.digits=2"),
    (["task=gsm8k", "task.train_path=t.jsonl"], "task.ops=[-]"),
    (["task=gsm8k", "task.train_path=t.jsonl"], "task.chosen_column=c"),
    (["task=preference", "task.preference_path=p.jsonl", "algo=dpo", "sft.enable=false"], "task.answer_column=a"),
    (["task=preference", "task.preference_path=p.jsonl", "algo=dpo", "sft.enable=false"], "task.val_split=v"),
])
def test_an_option_the_task_ignores_is_refused(task, override):
    field = override.split("=")[0]
    algo = [] if any(o.startswith("algo=") for o in task) else GRPO
    with pytest.raises(ConfigError, match=rf"^{field}=.* is invalid: expected .* \(its default\) with task.name="):
        to_object(compose_root(*algo, *task, "reference=fixed", override))


def test_options_a_task_reads_are_accepted():
    to_object(compose_root(*GRPO, "task.preference_path=p.jsonl", "task.prompt_column=p", "task.train_split=t"))
    to_object(compose_root(*GRPO, "task=gsm8k", "task.train_path=t.jsonl", "task.dataset_config=main",
                           "task.question_column=q", "task.eval_split=e"))


def test_the_embedded_prompt_length_is_the_tokenized_one(tmp_path):
    from refexp.tasks import build_task

    for digits in (1, 3):
        cfg = TaskConfig(digits=digits, num_train=40, num_eval=8, ops=["+", "*"])
        task = build_task(cfg, str(tmp_path), algo="grpo")
        lengths = {len(task.tokenizer.encode(p, add_bos=True)) for p in [*task.train["prompt"], *task.eval["prompt"]]}
        assert lengths == {cfg.embedded_prompt_tokens()}
    assert TaskConfig(chat_template=True).embedded_prompt_tokens() is None


def test_a_data_files_prompt_and_generation_are_checked_against_max_seq_len_when_read():
    from refexp.tasks import build_char_tokenizer
    from refexp.tasks.splits import check_lengths

    splits = {"train": datasets.Dataset.from_dict({"prompt": ["1+1=", "12+345="]}),
              "eval": datasets.Dataset.from_dict({"prompt": ["9+9="]})}
    tok, cfg = build_char_tokenizer(), TaskConfig(max_new_tokens=10)
    check_lengths(cfg, tok, splits, "grpo", max_seq_len=18)  # 8 + 10
    with pytest.raises(ConfigError, match=r"^task.max_new_tokens=10 is invalid with model.max_seq_len=17: expected "
                                          r"at most 9 \(the prompt of train row 1 has 8 tokens"):
        check_lengths(cfg, tok, splits, "grpo", max_seq_len=17)
    with pytest.raises(ConfigError, match=r"^algo.max_new_tokens=12 is invalid with model.max_seq_len=18"):
        check_lengths(cfg, tok, splits, "grpo", max_seq_len=18, new_tokens=("algo.max_new_tokens", 12))


@pytest.mark.parametrize("content, says", [("", "is empty (0 bytes)"), ("\n  \n", "empty: no rows")])
def test_an_empty_jsonl_says_which_file_and_that_it_is_empty(tmp_path, content, says):
    from refexp.tasks.files import load_table

    path = tmp_path / "train.jsonl"
    path.write_text(content)
    with pytest.raises(ConfigError) as e:
        load_table(str(path))
    assert str(path) in str(e.value) and says in str(e.value), e.value
