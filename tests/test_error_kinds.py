"""scripts/analysis/error_kinds.py files each greedy completion under the kind the headroom task defines: its
missed ones-carry is the task's own slip (``refexp.tasks.arithmetic.slip_carry``), tens digit 0 included."""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "analysis"))

import error_kinds  # noqa: E402


@pytest.mark.parametrize("prompt, completion, kind", [
    ("018+025=", "0043", "correct"),
    ("018+025=", "0033", "missed ones-carry"),  # 8+5 carries; the tens digit forgot it
    ("092+009=", "0191", "missed ones-carry"),  # tens digit 0: the slip writes 9 (mod 10), not 101-10=91
    ("012+025=", "0047", "carry added without one"),  # 2+5 does not carry; the tens digit one higher
    ("090+000=", "0000", "carry added without one"),  # tens digit 9: one higher mod 10, as the slip undone
    ("012+025=", "0036", "other"),
    ("018+025=", "0053", "other"),  # the tens digit off the other way on a sum that carries
    ("012+025=", "x", "other"),
    ("043-025=", "018", "correct"),  # the retained skill: a difference, zero-padded to the operands' width
    ("043-025=", "0018", "correct"),  # the same number with one more leading zero
    ("043-025=", "008", "other"),  # what the sums' slip would write: only a sum has that kind
    ("012*025=", "000300", "correct"),
    ("012*025=", "000310", "other"),
])
def test_each_kind(prompt, completion, kind):
    assert error_kinds.classify(prompt, completion) == kind


def test_a_prompt_without_an_operator_is_refused():
    with pytest.raises(ValueError, match="not a problem"):
        error_kinds.classify("012/025=", "0")


def test_every_slipped_demonstration_of_the_task_is_a_missed_carry():
    from refexp.config import TaskConfig
    from refexp.tasks.arithmetic import generate_arithmetic

    train = generate_arithmetic(TaskConfig(num_train=800, num_eval=10, demo_slip=1.0))["train"]  # + and -
    kinds = collections.Counter((row["completion"] != row["solution"], error_kinds.classify(row["prompt"],
                                                                                            row["completion"]))
                                for row in train)
    assert set(kinds) == {(True, "missed ones-carry"), (False, "correct")}, kinds
    assert {row["prompt"][3] for row in train} == {"+", "-"}  # the default task's two skills, both classified
    tens_zero = [r for r in train if r["completion"] != r["solution"] and r["solution"][-2] == "0"]
    assert tens_zero  # the case the arithmetic a+b-10 misfiled


def test_the_markdown_file_names_the_experiment_and_the_start_without_machine_paths(tmp_path):
    totals = {"SFT start": collections.Counter({"correct": 3, "missed ones-carry": 1}),
              "fixed": collections.Counter({"correct": 6, "other": 2})}
    table = error_kinds.markdown_table(totals, {"fixed": 2})
    assert table.splitlines()[2] == "| SFT start | 0.750 | 0.250 | 0.000 | 0.000 | 1 | 4 |"
    assert table.splitlines()[3] == "| fixed | 0.750 | 0.000 | 0.000 | 0.250 | 2 | 8 |"
    text = error_kinds.markdown_file(table, ["compare_refs_grpo"] * 2, tmp_path / "sft" / "abc123" / "model", 200)
    assert text.startswith("# Error kinds of `compare_refs_grpo`\n") and "`abc123`" in text
    assert str(tmp_path) not in text and text.endswith(table)


def test_a_sweep_dir_stands_for_its_jobs_in_job_order(tmp_path):
    for job in ("10", "2", "notes"):
        (tmp_path / job / ("checkpoint" if job != "notes" else "x")).mkdir(parents=True)
    assert error_kinds.run_dirs([tmp_path]) == [tmp_path / "2", tmp_path / "10"]
    assert error_kinds.run_dirs([tmp_path / "10"]) == [tmp_path / "10"]
