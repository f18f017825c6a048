"""What a job of a sweep set: its Hydra overrides as ``{key: value}``, without the seed and Hydra's own keys;
and which keys a sweep varies across its jobs.

The report groups runs by these settings (``refexp/report/reading/group.py``) and W&B groups them the same way
(``refexp/components/wandb_conventions.py``), so a dashboard's line and a report's row are the same runs. A number
is one setting however it was spelled: a sweep job records the value its sweeper parsed (``training.lr=0.001``)
and a rerun of that job typed by hand records the text typed (``training.lr=1e-3``), so each value is read as
Hydra reads it (``normalised_value``).
"""

from __future__ import annotations

import math
import re
from typing import Iterable

from refexp.choices import current_choice

SEED_KEYS = {"training.seed", "seed", "sft.seed"}
"""What a group averages over: never part of a group. ``sft.seed`` makes another SFT start, a replicate the report
nests the seeds in (``refexp/report/statistics/paired.py``), not another arm."""


_UNSIGNED = r"(?:0|[1-9](?:_?[0-9])*)"
_POINT_FLOAT = rf"(?:{_UNSIGNED}\.|{_UNSIGNED}?\.[0-9](?:_?[0-9])*)"
_INT = re.compile(rf"[+-]?{_UNSIGNED}")
_FLOAT = re.compile(rf"[+-]?(?:(?:{_UNSIGNED}|{_POINT_FLOAT})[eE][+-]?[0-9](?:_?[0-9])*|{_POINT_FLOAT}|inf|nan)",
                    re.IGNORECASE)
"""Hydra's override grammar's INT and FLOAT (hydra/grammar/OverrideLexer.g4): what it reads as a number, not a
string (``007`` and a quoted ``'1e-3'`` are strings)."""


def spelled_number(value: str) -> int | float | None:
    """The number an override's value spells as Hydra reads it (``1e-3`` -> 0.001, ``1_000`` -> 1000), else None."""
    if _INT.fullmatch(value):
        return int(value.replace("_", ""))
    if _FLOAT.fullmatch(value):
        return float(value.replace("_", ""))
    return None


def normalised_value(value: str) -> str:
    """One spelling per number, keeping Hydra's type: an int as Python writes it (``+5`` -> ``5``), a float as the
    shortest text that reads back the same (``1e-3`` and ``0.0010`` -> ``0.001``; ``1.0`` stays ``1.0``; ``1e-05``
    written ``1e-5``); any other value as it is."""
    number = spelled_number(value)
    if number is None:
        return value
    if isinstance(number, int):
        return str(number)
    return re.sub(r"e([+-]?)0*(?=[0-9])", r"e\1", repr(number)) if math.isfinite(number) else repr(number)


def _key(override_key: str) -> str:
    """``+x`` / ``++x`` / ``~x`` -> ``x``: adding or deleting a key sets the same setting."""
    return override_key.lstrip("+~")


def swept_settings(overrides: list[str], *, drop: tuple[str, ...] = ("algo", "reference")) -> dict[str, str]:
    """``key=value`` overrides as {key: value} without the seed, ``hydra*`` and the keys in ``drop`` (the
    group choices a table or a W&B field names already). ``+x=1`` / ``++x=1`` count as ``x``; ``~x`` as
    ``x=<deleted>``; a number in one spelling (``normalised_value``); a choice renamed since (``refexp/choices.py``'s
    ``RENAMED_CHOICES``) as today's name."""
    out: dict[str, str] = {}
    for o in overrides:
        key, eq, value = o.partition("=")
        key = _key(key)
        if not eq:
            value = "<deleted>"
        if key in SEED_KEYS or key in drop or key == "hydra" or key.startswith(("hydra.", "hydra/")):
            continue
        out[key] = current_choice(key, normalised_value(value))
    return out


def swept_keys(sweep_overrides: Iterable[str]) -> set[str]:
    """The keys a sweep varies across its jobs: those of its overrides that Hydra's parser reads as a sweep
    (``a,b``, ``choice(...)``, ``range(...)``, ``interval(...)``), spelled as ``swept_settings`` spells them.
    ``sweep_overrides`` is the sweep's command line plus its ``hydra.sweeper.params`` as ``key=value``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(sweep_overrides))
    return {_key(o.get_key_element()) for o in parsed if o.is_sweep_override()}


def only_swept(overrides: list[str], swept: Iterable[str]) -> list[str]:
    """The overrides whose key is in ``swept`` (``swept_keys``): what tells a sweep's jobs apart."""
    keys = set(swept)
    return [o for o in overrides if _key(o.partition("=")[0]) in keys]
