"""Whether a reward-model dir holds the weights of its classifier head, read from the weight files' names alone
(safetensors headers, an index's weight map), before any model is built.

transformers' ``from_pretrained`` gives a sequence classifier whose checkpoint lacks the head (a causal LM's
export with a classifier's config.json) a freshly initialised ``score`` head and only warns, a warning refexp
silences while loading (``quiet_transformers`` below): GRPO would then optimise a random reward.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from typing import Optional

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
"""The weight files transformers' ``from_pretrained`` reads from a local dir (one file or an indexed set)."""


@contextmanager
def quiet_transformers():
    """transformers' warnings and progress bars off while a checkpoint loads (a fresh head's "newly initialized"
    notice, a loading bar per model), its settings restored after."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def stored_tensor_names(path: str) -> Optional[set[str]]:
    """Names of the tensors stored in the HF checkpoint dir ``path`` (headers only: no tensor is read), None when
    it holds none of ``WEIGHT_FILES``."""
    for name in WEIGHT_FILES:
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            continue
        if name.endswith(".index.json"):
            with open(file) as f:
                return set(json.load(f)["weight_map"])
        if name.endswith(".safetensors"):
            from safetensors import safe_open

            with safe_open(file, framework="pt") as f:
                return set(f.keys())
        import torch

        # mmap: the names without reading the tensors; weights_only: a pickle that runs no code
        return set(torch.load(file, map_location="cpu", mmap=True, weights_only=True))
    return None


def head_weight_names(path: str) -> Optional[list[str]]:
    """The parameters of the sequence classifier that config.json at ``path`` describes that lie outside its
    backbone (``base_model_prefix``): the head (``score.weight`` for a Llama or Qwen classifier); None when
    transformers cannot build the config (an architecture it does not know)."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    try:
        with quiet_transformers():
            config = AutoConfig.from_pretrained(path, local_files_only=True)
            with torch.device("meta"):
                model = AutoModelForSequenceClassification.from_config(config)
    except (ValueError, KeyError, OSError):
        return None
    prefix = model.base_model_prefix + "."
    return sorted(n for n, _ in model.named_parameters() if not n.startswith(prefix))


def weights_problem(path: str) -> Optional[str]:
    """What the reward-model dir ``path`` lacks among its weights (no weight file; the head's tensors), None when
    nothing is missing."""
    stored = stored_tensor_names(path)
    if stored is None:
        return f"no weight files ({', '.join(WEIGHT_FILES)})"
    head = head_weight_names(path)
    missing = [n for n in head or () if n not in stored]
    if missing:
        return (f"no weights for its classifier head ({', '.join(missing)}): transformers would initialise it at "
                f"random (a causal LM's export with a classifier's config.json?)")
    return None
