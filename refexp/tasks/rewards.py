"""Verifiable rewards: parse a number out of model text (with regular expressions, never ``eval``)
and compare it with the reference answer. Every reward here takes arbitrary model output and
never raises: malformed text parses to None and earns 0.0.

``load_reward`` imports a user's reward named by ``task.reward`` instead.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Optional

from refexp.config import ConfigError

_INTEGER = re.compile(r"-?[0-9]+")
# A GSM8K number: thousands groups with commas ("1,234") or plain digits, an optional decimal part.
# The grouped form is tried first and demands exact groups of three, so "1,2,3" is not 123.
_NUMBER = re.compile(r"-?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?")
_GSM8K_MARK = "####"
# The content of the last \boxed{...} (one level of nested braces, e.g. \boxed{\text{72}}).
_BOXED = re.compile(r"\\boxed\s*\{((?:[^{}]|\{[^{}]*\})*)\}")


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
    """The final answer of a GSM8K-style solution, in this order: the first number after the last
    ``####``, else the first number inside the last ``\\boxed{...}`` (None when a marker is there but
    nothing numeric follows it), else, as a fallback for unmarked text, the last number in the text.
    Commas are thousands separators; ``$`` and units around the number are ignored."""
    if not isinstance(text, str):
        return None
    if _GSM8K_MARK in text:
        match = _NUMBER.search(text.rsplit(_GSM8K_MARK, 1)[1])
    elif boxed := _BOXED.findall(text):
        match = _NUMBER.search(boxed[-1])
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


def no_reward(completion: str, answer: str) -> float:
    """The ``preference`` task's: it has pairs, not answers, so nothing may score against it (its
    config refuses GRPO and SFT before this could be reached)."""
    raise RuntimeError("task=preference has no reward: it holds preference pairs only (use algo=dpo)")


def load_reward(spec: str, field_name: str = "task.reward") -> Callable[[str, str], float]:
    """The function ``spec`` names: ``package.module:function`` or ``package.module.function``,
    called as ``reward(completion, answer) -> float``. ConfigError naming ``field_name`` when it
    does not import, is not callable, or cannot take those two arguments."""
    module_name, sep, attr = spec.partition(":") if ":" in spec else spec.rpartition(".")
    if not module_name or not attr:
        raise ConfigError(f"{field_name}={spec!r} is invalid: expected package.module:function "
                          f"or package.module.function")
    try:
        fn = importlib.import_module(module_name)
        for part in attr.split("."):
            fn = getattr(fn, part)
    except Exception as e:  # ImportError, AttributeError, or the module's own import-time error
        raise ConfigError(f"{field_name}={spec!r} could not be imported: {type(e).__name__}: {e}") from e
    if not callable(fn):
        raise ConfigError(f"{field_name}={spec!r} is a {type(fn).__name__}: expected a function "
                          f"(completion: str, answer: str) -> float")
    try:
        inspect.signature(fn).bind("completion", "answer")
    except TypeError as e:
        raise ConfigError(f"{field_name}={spec!r} cannot be called as reward(completion, answer): {e}") from e
    except ValueError:  # a builtin without a signature: trust it
        pass
    return fn
