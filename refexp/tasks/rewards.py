"""Verifiable rewards: parse a number out of model text (with regular expressions, never ``eval``)
and compare it with the reference answer. Every function here takes arbitrary model output and
never raises: malformed text parses to None and earns 0.0.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Optional

_INTEGER = re.compile(r"-?[0-9]+")
# A GSM8K number: thousands groups with commas ("1,234") or plain digits, an optional decimal part.
# The grouped form is tried first and demands exact groups of three, so "1,2,3" is not 123.
_NUMBER = re.compile(r"-?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?")
_GSM8K_MARK = "####"


def parse_integer(text: str) -> Optional[int]:
    """The integer ``text`` spells (surrounding whitespace and leading zeros allowed), else None.

    Only ASCII digits with an optional leading ``-``: Python's ``int`` would also accept ``1_000``,
    ``+5`` and non-ASCII digits, which a model answer should not get credit for.
    """
    if not isinstance(text, str):
        return None
    text = text.strip()
    if not _INTEGER.fullmatch(text):
        return None
    try:
        return int(text)
    except ValueError:  # more digits than int() converts (sys.get_int_max_str_digits)
        return None


def exact_match_reward(completion: str, answer: str) -> float:
    """1.0 when the completion and the answer parse to the same integer, else 0.0."""
    got, want = parse_integer(completion), parse_integer(answer)
    return 1.0 if got is not None and got == want else 0.0


def extract_gsm8k_number(text: str) -> Optional[Decimal]:
    """The number after the last ``####`` if there is one (None when nothing numeric follows it),
    else the last number in the text; commas are thousands separators."""
    if not isinstance(text, str):
        return None
    if _GSM8K_MARK in text:
        match = _NUMBER.search(text.rsplit(_GSM8K_MARK, 1)[1])
    else:
        matches = _NUMBER.findall(text)
        match = matches[-1] if matches else None
    if match is None:
        return None
    token = match if isinstance(match, str) else match.group(0)
    try:
        return Decimal(token.replace(",", ""))
    except InvalidOperation:  # unreachable for what _NUMBER matches; kept so this never raises
        return None


def gsm8k_reward(completion: str, answer: str) -> float:
    """1.0 when the completion's final number equals the reference's numerically (``72`` = ``72.0``).

    ``answer`` may be the bare number (``refexp.tasks.gsm8k``'s ``answer`` column) or a whole GSM8K
    solution ending in ``#### 72``; both go through the same extraction as the completion.
    """
    got, want = extract_gsm8k_number(completion), extract_gsm8k_number(answer)
    return 1.0 if got is not None and got == want else 0.0
