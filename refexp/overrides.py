"""What a job of a sweep set: its Hydra overrides as ``{key: value}``, without the seed and Hydra's own keys.

The report groups runs by these settings (``refexp/report/group.py``) and W&B groups them the same way
(``refexp/wandb_conventions.py``), so a dashboard's line and a report's row are the same runs.
"""

from __future__ import annotations

SEED_KEYS = {"training.seed", "seed"}
"""What a group averages over: never part of a group."""


def swept_settings(overrides: list[str], *, drop: tuple[str, ...] = ("algo", "reference")) -> dict[str, str]:
    """``key=value`` overrides as {key: value} without the seed, ``hydra*`` and the keys in ``drop`` (the
    group choices a table or a W&B field names already). ``+x=1`` / ``++x=1`` count as ``x``; ``~x`` as
    ``x=<deleted>``."""
    out: dict[str, str] = {}
    for o in overrides:
        key, eq, value = o.partition("=")
        key = key.lstrip("+~")
        if not eq:
            value = "<deleted>"
        if key in SEED_KEYS or key in drop or key == "hydra" or key.startswith(("hydra.", "hydra/")):
            continue
        out[key] = value
    return out
