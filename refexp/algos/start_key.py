"""How a cache key made from a model (DPO's pairs and reference table, the reward model) names that model's dir."""

from __future__ import annotations

import os
from pathlib import Path

from refexp.config.diff import in_cache_terms


def start_in_key(cfg, start: str | os.PathLike) -> str:
    """``start`` resolved, as a cache key holds it (``cfg``: the RootConfig): in cache terms (``in_cache_terms``)
    when the config names it (``model.hf_assets_path``, ``sft.checkpoint``, ``reference.checkpoint``,
    ``checkpoint.initial_load_path``: ``model.pretrained``'s converted dir lies in the cache), so a copied or moved
    cache keeps the key. The SFT stage's own output (``<cache>/sft/<key>``, which no config names) keeps its
    absolute path: the key of every entry made from it before."""
    resolved = Path(start).resolve()
    named = (cfg.model.hf_assets_path, cfg.sft.checkpoint, cfg.reference.checkpoint,
             cfg.checkpoint.initial_load_path)
    if resolved in {Path(p).resolve() for p in named if p}:
        return in_cache_terms(str(resolved), cfg.sft.cache_dir)
    return str(resolved)
