"""``ConfigError`` and the small checks every schema's ``__post_init__`` uses.

Each check names the field (``group.field``) and says what would be valid, so a bad value fails with
one readable line before any model is built.
"""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A config value is invalid; the message names the field and what would be valid."""


def check(cond: bool, field_name: str, value: Any, valid: str) -> None:
    """Raise ``ConfigError`` ("<field>=<value> is invalid: expected <valid>") unless ``cond``."""
    if not cond:
        raise ConfigError(f"{field_name}={value!r} is invalid: expected {valid}")


def positive_int(name: str, v: Any) -> None:
    check(isinstance(v, int) and not isinstance(v, bool) and v > 0, name, v, "a positive integer")


def non_negative(name: str, v: Any) -> None:
    check(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0, name, v, "a number >= 0")


def one_of(name: str, v: Any, options: tuple) -> None:
    check(v in options, name, v, "one of " + ", ".join(map(str, options)))
