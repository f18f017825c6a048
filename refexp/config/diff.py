"""Which fields differ between two resolved configs (a run dir's ``resolved_config.yaml`` and a rerun's).

A rerun in the same run dir resumes from its checkpoint, and its metrics continue the earlier ones in
one ``metrics.jsonl``: with a different configuration the run's numbers would come from two experiments.
Fields that change how a run executes but not what it computes may differ (``RESUMABLE_CHANGES``), the cache dir
among them; a path inside the cache dir (``model.hf_assets_path`` of ``model.pretrained``, which refexp converts into
the cache) compares by where it lies in the cache (``cache_relative``), so a run resumes with a copied cache. A choice
renamed since the run was recorded (``refexp/choices.py``'s ``RENAMED_CHOICES``: ``algo.objective: sft``) compares
under today's name, so a run dir of the continued-SFT baseline recorded before the rename still resumes.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from refexp.choices import current_choice

CACHE_DIR = "sft.cache_dir"
IN_CACHE = "${sft.cache_dir}"
"""What a path inside the cache dir starts with once ``in_cache_terms`` has rewritten it."""

RESUMABLE_CHANGES = (
    "training.steps",      # a finished run continues (the LR schedule does not depend on it)
    "logger.",             # where metrics go
    "parallelism.",        # DCP reshards; the same numbers at any world size (tests/test_distributed.py)
    "comm.",               # timeouts, backend
    "training.num_threads", "training.device", "training.deterministic",
    "sft.cache_dir",       # where the caches live (their contents are keyed by what determines them)
    "checkpoint.interval", "checkpoint.keep_latest_k", "checkpoint.async_mode", "checkpoint.load_step",
    "checkpoint.last_save_in_hf",
    "run_dir", "dry_run",  # the same dir, spelled relative or absolute
)
"""Dotted names (a trailing dot: the whole block) a rerun may change."""


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists stay values."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, name + "."))
        else:
            out[name] = v
    return out


def in_cache_terms(value: Any, cache_dir: str | None) -> Any:
    """``value`` (a path, or a list, tuple or dict holding some) with every path inside ``cache_dir`` written as
    ``${sft.cache_dir}/<its place in the cache>``, anything else as it was: a cache entry is named by what
    determines it, so the same path in a copy of the cache (another ``REFEXP_CACHE``) names the same thing. The
    config comparison (``cache_relative``) and every cache key that holds a config part use it. ``cache_dir`` is
    recognised as written, with ``~`` expanded, made absolute and with its links resolved (``Path.resolve``)."""
    if not isinstance(cache_dir, str) or not cache_dir:
        return value
    expanded = os.path.expanduser(cache_dir)
    roots = {os.path.normpath(cache_dir), os.path.normpath(expanded), os.path.abspath(expanded),
             os.path.realpath(expanded)}
    roots = sorted((r.rstrip(os.sep) for r in roots), key=len, reverse=True)  # the innermost root names the place

    def relative(v: Any) -> Any:
        if isinstance(v, Mapping):
            return {k: relative(x) for k, x in v.items()}
        if type(v) in (list, tuple):
            return type(v)(relative(x) for x in v)
        if not isinstance(v, str) or not v:
            return v
        path = os.path.normpath(v)
        root = next((r for r in roots if path == r or path.startswith(r + os.sep)), None)
        return v if root is None else IN_CACHE + path[len(root):]

    return relative(value)


def cache_relative(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``flat`` (a ``flatten``ed config) with every path inside its ``sft.cache_dir`` (a value, or an item of a list)
    written relative to it (``in_cache_terms``)."""
    cache = flat.get(CACHE_DIR)
    return {k: v if k == CACHE_DIR else in_cache_terms(v, cache) for k, v in flat.items()}


def comparable(tree: Mapping[str, Any]) -> dict[str, Any]:
    """A resolved config as two runs' configs are compared: flattened, paths into the cache relative to it."""
    return cache_relative(flatten(tree))


def _resumable(name: str) -> bool:
    return any(name == p or (p.endswith(".") and name.startswith(p)) for p in RESUMABLE_CHANGES)


def changed_fields(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{field: (old value, new value)}`` for the fields both configs have and a rerun may not change.

    A field only one of them has is left out: the schema grew or shrank between versions of refexp,
    and the run then used what is now the default. ``old``'s renamed choices read as today's (``current_choice``);
    paths into each side's cache dir compare relative to it (``cache_relative``).
    """
    a, b = {k: current_choice(k, v) for k, v in comparable(old).items()}, comparable(new)
    return {k: (a[k], b[k]) for k in sorted(a.keys() & b.keys()) if a[k] != b[k] and not _resumable(k)}
