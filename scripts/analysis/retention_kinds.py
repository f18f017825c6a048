"""Which mistakes a model makes on the skills RL does not train (``task.ops`` minus ``task.rl_ops``: subtraction in
the default task, whose held-out prompts ``eval/retention`` reads), one kind per greedy completion:

==========================  ==================================================================================
kind                        the completion, against the correct difference ``a-b`` (zero-padded to its width)
==========================  ==================================================================================
correct                     the same number (leading zeros aside, as ``eval/retention``'s exact match)
wrote a+b                   the number ``a+b``: the RL skill's answer to the same operands, at any width
missed borrow               one digit above the ones one higher (mod 10), where the column to its right borrows
                            (``a``'s lower digits < ``b``'s): the borrow not taken (``043-025=`` -> ``028``)
borrow added without one    one digit above the ones one lower (mod 10), where the column to its right does not
                            borrow: a borrow taken that is not there (``068-024=`` -> ``034``)
ones digit off by one       only the ones digit wrong, by one either way (mod 10), which no borrow explains
other                       anything else: two digits wrong, a digit off by more than one or the other way,
                            another width, text that is not digits
==========================  ==================================================================================

The digit kinds change one digit only, mod 10, as the sums' slip does (``refexp.tasks.arithmetic.slip_carry``): a
missed borrow on a tens digit 9 writes 0, and a changed borrow out of that column is not followed. They are
subtraction's; a wrong answer of another retained operator is ``wrote a+b`` or ``other``.
"""

from __future__ import annotations

from refexp.choices import ARITHMETIC_OPS
from refexp.tasks.arithmetic import format_problem

KINDS = ("correct", "wrote a+b", "missed borrow", "borrow added without one", "ones digit off by one", "other")
DESCRIBED = ("`wrote a+b` is the number a+b, the RL skill's answer to the same operands; `missed borrow` is one "
             "digit above the ones one higher (mod 10) where the column to its right borrows; `borrow added without "
             "one` is one digit above the ones one lower (mod 10) where that column does not borrow; `ones digit off "
             "by one` is only the ones digit wrong, by one either way; `other` is anything else")
"""What the kinds mean, for the markdown file that reports them."""


def borrows_into(a: int, b: int, column: int) -> bool:
    """Whether ``a - b`` (``a >= b``) borrows into ``column`` (0: the ones): ``a``'s lower ``column`` digits are
    less than ``b``'s."""
    return a % 10**column < b % 10**column


def classify(prompt: str, completion: str) -> str:
    """``a<op>b=`` (zero-padded operands, an operator of ``task.ops``) and the completion -> one of KINDS."""
    op = next((o for o in ARITHMETIC_OPS if o in prompt), None)
    if op is None:
        raise ValueError(f"{prompt!r} is not a problem of the arithmetic task (no operator of {ARITHMETIC_OPS})")
    left, right = prompt.rstrip("=").split(op)
    a, b = int(left), int(right)
    _, correct, _ = format_problem(op, a, b, len(left))
    got = completion.strip()
    if not (got.isascii() and got.isdigit()):
        return "other"
    if int(got) == int(correct):
        return "correct"
    if int(got) == a + b:
        return "wrote a+b"
    got = got.zfill(len(correct))
    wrong = [i for i, (g, c) in enumerate(zip(got, correct)) if g != c]
    if op != "-" or len(got) != len(correct) or len(wrong) != 1:
        return "other"
    column = len(correct) - 1 - wrong[0]  # 0: the ones
    step = (int(got[wrong[0]]) - int(correct[wrong[0]])) % 10  # 1: one higher, 9: one lower
    if column == 0:
        return "ones digit off by one" if step in (1, 9) else "other"
    if step == 1 and borrows_into(a, b, column):
        return "missed borrow"
    if step == 9 and not borrows_into(a, b, column):
        return "borrow added without one"
    return "other"
