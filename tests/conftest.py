"""Shared test set-up: one intra-op thread per process (2 shared cores; docs/torchtitan-notes.md §11),
W&B never reaches a server, and each test gets its own refexp cache."""

import os

import pytest
import torch

torch.set_num_threads(1)
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Each test session shares one cache dir under pytest's tmp (never ~/.cache)."""
    cache = tmp_path_factory.getbasetemp() / "refexp-cache"
    monkeypatch.setenv("REFEXP_CACHE", str(cache))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path_factory.getbasetemp() / "wandb"))
