"""scripts/analysis/retention_kinds.py files each greedy completion of a skill RL does not train (subtraction) under
one kind: the RL skill's answer a+b, a borrow missed or added in one digit above the ones, the ones digit off by one,
or anything else; and scripts/analysis/error_kinds.py --retention reports them."""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "analysis"))

import error_kinds  # noqa: E402
import retention_kinds  # noqa: E402


@pytest.mark.parametrize("prompt, completion, kind", [
    ("043-025=", "018", "correct"),
    ("043-025=", "0018", "correct"),  # the same number with one more leading zero, as eval/retention scores it
    ("043-025=", "068", "wrote a+b"),  # 43+25: the RL skill's answer
    ("757-731=", "1488", "wrote a+b"),  # at the sums' width
    ("043-025=", "028", "missed borrow"),  # 3 < 5 borrows into the tens; the tens digit did not take it
    ("310-120=", "290", "missed borrow"),  # 10 < 20 borrows into the hundreds
    ("100-001=", "009", "missed borrow"),  # tens digit 9: one higher mod 10 (the borrow out of it not followed)
    ("068-024=", "034", "borrow added without one"),  # 8 >= 4: no borrow, yet the tens digit is one lower
    ("606-102=", "594", "borrow added without one"),  # tens digit 0: one lower mod 10
    ("976-756=", "210", "borrow added without one"),  # equal ones (6 - 6) do not borrow
    ("976-756=", "230", "other"),
    ("043-025=", "008", "other"),  # one lower where the ones do borrow: not a borrow missed or added
    ("068-024=", "054", "other"),  # one higher where the ones do not borrow
    ("757-731=", "025", "ones digit off by one"),
    ("841-741=", "109", "ones digit off by one"),  # 0 -> 9: one lower mod 10
    ("757-731=", "028", "other"),  # the ones digit off by two
    ("412-184=", "248", "other"),  # the tens digit off by two
    ("630-272=", "367", "other"),  # two digits wrong
    ("043-025=", "0028", "other"),  # a missed borrow at the sums' width: another width
    ("043-025=", "x", "other"),
    ("043-025=", "", "other"),
    ("012*025=", "000300", "correct"),  # another retained operator: correct, a+b or other only
    ("012*025=", "000037", "wrote a+b"),
    ("012*025=", "000310", "other"),
])
def test_each_kind(prompt, completion, kind):
    assert retention_kinds.classify(prompt, completion) == kind


def test_a_prompt_without_an_operator_is_refused():
    with pytest.raises(ValueError, match="not a problem"):
        retention_kinds.classify("012/025=", "0")


def schoolbook_forgetting(a: int, b: int, digits: int, column: int) -> str:
    """``a - b`` column by column, the borrow into ``column`` not taken there (every other digit right)."""
    out, borrow = [], 0
    for k in range(digits):
        x, y = a // 10**k % 10, b // 10**k % 10
        taken = 0 if k == column else borrow
        out.append(str((x - y - taken) % 10))
        borrow = 1 if x - y - borrow < 0 else 0
    return "".join(reversed(out))


def test_forgetting_a_borrow_the_schoolbook_way_is_a_missed_borrow():
    kinds = collections.Counter()
    for a in range(1000):
        for b in range(0, a + 1, 7):
            for column in (1, 2):
                completion = schoolbook_forgetting(a, b, 3, column)
                if completion != f"{a - b:03d}" and a + b != int(completion):
                    kinds[retention_kinds.classify(f"{a:03d}-{b:03d}=", completion)] += 1
    assert set(kinds) == {"missed borrow"} and kinds["missed borrow"] > 1000, kinds


def test_the_retention_markdown_names_its_prompts_and_kinds(tmp_path):
    totals = {"SFT start": collections.Counter({"correct": 3, "missed borrow": 1}),
              "fixed": collections.Counter({"correct": 4, "wrote a+b": 2, "ones digit off by one": 2})}
    table = error_kinds.markdown_table(totals, {"fixed": 2}, retention_kinds.KINDS)
    assert table.splitlines()[0].startswith("| group | correct | wrote a+b | missed borrow |")
    assert table.splitlines()[2] == "| SFT start | 0.750 | 0.000 | 0.250 | 0.000 | 0.000 | 0.000 | 1 | 4 |"
    assert table.splitlines()[3] == "| fixed | 0.500 | 0.250 | 0.000 | 0.000 | 0.250 | 0.000 | 2 | 8 |"
    text = error_kinds.markdown_file(table, ["long_horizon_grpo"], tmp_path / "sft" / "abc123" / "model", 200,
                                     error_kinds.RETAINED_SKILLS)
    assert text.startswith("# Retained-skill error kinds of `long_horizon_grpo`\n")
    assert "`retain_eval`" in text and "--retention" in text and "`abc123`" in text and text.endswith(table)
