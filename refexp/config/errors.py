"""``ConfigError`` and the small checks every schema's ``__post_init__`` uses.

Each check names the field (``group.field``) and says what would be valid, so a bad value fails with
one readable line before any model is built.
"""

from __future__ import annotations

import math
from dataclasses import fields, is_dataclass
from typing import Any

from refexp.choices import RENAMED_CHOICES


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
    """``v`` is one of ``options``; a value renamed since (``choices.RENAMED_CHOICES``) is refused naming today's."""
    renamed = RENAMED_CHOICES.get(name, {}).get(v) if isinstance(v, str) else None
    check(v in options, name, v, "one of " + ", ".join(map(str, options))
          + (f" ({v} was renamed to {renamed})" if renamed else ""))


INFINITY_MEANS_SOMETHING = {
    "training.max_norm": "no gradient clipping (clip_grad_norm_ scales by min(1, inf / norm) = 1)",
    "algo.eps_low": "no lower clip of the probability ratio",
    "algo.eps_high": "no upper clip of the probability ratio",
    "algo.tis_cap": "importance weights left untruncated",
}
"""The float fields where infinity is a meaningful setting (and what it means); NaN never is."""


def check_finite_floats(obj: Any, path: str = "") -> None:
    """Every float field of the dataclass ``obj`` and those nested in it is finite, or +-inf where
    ``INFINITY_MEANS_SOMETHING`` lists it (each schema's ``__post_init__`` checks the sign and range).
    One walk for all schemas: a comparison like ``beta >= 0`` lets inf through, which would otherwise
    fail only after the models are built."""
    for f in fields(obj):
        value, name = getattr(obj, f.name), f"{path}.{f.name}" if path else f.name
        if is_dataclass(value):
            check_finite_floats(value, name)
        elif isinstance(value, float) and not math.isfinite(value):
            check(not math.isnan(value) and name in INFINITY_MEANS_SOMETHING, name, value, "a finite number")
