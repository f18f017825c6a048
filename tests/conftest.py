"""Shared test set-up: one intra-op thread per process (docs/torchtitan-notes.md §11), W&B never reaches a
server, each test session has its own refexp cache, compiled kernels are cached apart per CPU kernel selection;
the tiny GRPO run's config composed once and copied per test (in the style of lightning-hydra-template's
tests/conftest.py; helpers in tests/helpers/)."""

import copy
import os

import pytest
import torch

from refexp.runtime.process_settings import compile_cache_per_kernel_selection
from tests.helpers.configs import TINY_GRPO_OVERRIDES, compose_tiny_run

torch.set_num_threads(1)
compile_cache_per_kernel_selection()  # tests compile blocks in this process too, outside any run
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Each test session shares one cache dir under pytest's tmp (never ~/.cache)."""
    cache = tmp_path_factory.getbasetemp() / "refexp-cache"
    monkeypatch.setenv("REFEXP_CACHE", str(cache))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path_factory.getbasetemp() / "wandb"))


@pytest.fixture
def dense_reward(monkeypatch):
    """A reward with signal even for a 30-step SFT model (which never gets an answer exactly right):
    the number of '1' digits, so advantages are non-zero and the policy moves."""
    import refexp.tasks as tasks_mod

    original = tasks_mod.build_task

    def build(*a, **k):
        task = original(*a, **k)
        task.reward = lambda completion, answer: float(completion.count("1"))
        return task

    monkeypatch.setattr(tasks_mod, "build_task", build)


@pytest.fixture
def sigint_deliverable():
    """SIGINT handled as Python's default (KeyboardInterrupt) for one test. A test run started as a background job
    without job control (``cmd &`` in a script, some CI runners) inherits SIGINT ignored, and refexp leaves an
    ignored SIGINT ignored (refexp/runtime/stop_signals.py): a test that sends itself SIGINT needs it deliverable."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory):
    """A tiny Qwen3 HF checkpoint with a chat template (tests/helpers/tiny_qwen3.py), written once per session."""
    from tests.helpers.tiny_qwen3 import qwen3_checkpoint

    path = tmp_path_factory.mktemp("pretrained") / "qwen3"
    qwen3_checkpoint(path)
    return path


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """SmolLM2-135M-Instruct converted into the session's cache (``model.pretrained=smollm2_135m``), once."""
    from tests.helpers.smollm2 import converted_dir

    return converted_dir(tmp_path_factory.getbasetemp() / "refexp-cache")


@pytest.fixture(scope="session")
def smollm2_gguf_model(tmp_path_factory):
    """transformers' own de-quantised SmolLM2-135M-Instruct, read from the wheel's GGUF file, once."""
    from tests.helpers.smollm2 import gguf_reference

    return gguf_reference(tmp_path_factory.mktemp("smollm2-gguf"))


@pytest.fixture(scope="package")
def tiny_grpo_config_global():
    """The tiny GRPO run's config (TINY_RUN_OVERRIDES + TINY_GRPO_OVERRIDES), composed once; tests take
    ``tiny_grpo_cfg``, their own copy."""
    return compose_tiny_run("/tmp/refexp-unused", *TINY_GRPO_OVERRIDES)


@pytest.fixture
def tiny_grpo_cfg(tiny_grpo_config_global, tmp_path):
    """A copy of the tiny GRPO run's config whose run dir is the test's ``tmp_path``; a test sets the values
    it changes (``cfg.sft.steps = 0``), as a ``key=value`` override would."""
    cfg = copy.deepcopy(tiny_grpo_config_global)
    cfg.run_dir = str(tmp_path)
    return cfg
