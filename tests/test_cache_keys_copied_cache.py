"""Cache keys and the cache dir: a config part that is a path into the cache (``model.pretrained``'s converted dir,
which becomes ``model.hf_assets_path`` and, for a text task, ``task.tokenizer_path``) counts by its place in the
cache (``refexp/config/diff.py``'s ``in_cache_terms``), so every key is the same in a copied or moved
``REFEXP_CACHE``; and a config without a path in the cache keeps the keys of the caches made before."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import datasets
import pytest
import torch

from refexp.algos.dpo_data import pairs_dir, pairs_key
from refexp.algos.dpo_reference import _table_key
from refexp.algos.rm import rm_fingerprint
from refexp.algos.sft import sft_fingerprint
from refexp.config import TaskConfig
from refexp.config.root import to_object
from refexp.tasks import _tokenizer, task_fingerprint
from tests.helpers.configs import TINY_RUN_OVERRIDES, compose_root

ENTRY = Path("pretrained") / "smollm2_135m-bcc8dd0c3edb2ef0-v1"
"""Where ``model.pretrained=smollm2_135m`` converts its checkpoint in the cache (``pretrained.entry_dir``)."""
POLICY = Path("exports") / "policy"


def _entry(cache: Path, name: Path = ENTRY) -> Path:
    """A converted checkpoint's files in ``cache``: what the keys read of it is paths, sizes and times."""
    d = cache / name
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / "tokenizer.json").write_text('{"model": "stand-in"}')
    (d / "model.safetensors").write_bytes(b"weights")
    policy = cache / POLICY  # a policy's HF export kept in the cache, for algo=rm's rm.policies
    policy.mkdir(parents=True, exist_ok=True)
    (policy / "config.json").write_text("{}")
    (policy / "model.safetensors").write_bytes(b"policy weights")
    return d


def _ctx(cache: Path, *overrides: str, entry: Path = ENTRY) -> SimpleNamespace:
    """What the key functions read of a run whose start is the converted dir ``entry`` in ``cache``."""
    cfg = to_object(compose_root("model=smollm2_135m", f"model.hf_assets_path={cache / entry}",
                                 f"sft.cache_dir={cache}", "task=reasoning_gym", "task.dataset=basic_arithmetic",
                                 *overrides))
    tokenizer = _tokenizer(TaskConfig())  # the keys hash its vocabulary size or its token table, never its path
    return SimpleNamespace(cfg=cfg, cache_dir=cache, device=torch.device("cpu"),
                           task=SimpleNamespace(tokenizer=tokenizer, max_new_tokens=cfg.task.max_new_tokens))


PAIRS = datasets.Dataset.from_dict({"prompt": ["1+1="], "chosen": ["2"], "rejected": ["3"]})

KEYS = {  # each cache key that hashes a config part, of a run whose start is the converted dir in the cache
    "sft": (("sft.enable=true", "algo=grpo"), lambda ctx: sft_fingerprint(ctx)),
    "task": (("algo=grpo",), lambda ctx: task_fingerprint(ctx.cfg.task, ctx.cfg.sft.cache_dir)),
    "dpo pairs": (("algo=dpo",),
                  lambda ctx: pairs_dir(ctx.cache_dir, pairs_key(ctx, ctx.cfg.model.hf_assets_path)).name),
    "dpo reference table": (("algo=dpo",), lambda ctx: _table_key(ctx, PAIRS, Path(ctx.cfg.model.hf_assets_path))),
    "reward model": (("algo=rm", "sft.enable=true", f"rm.policies=['${{sft.cache_dir}}/{POLICY}']"),
                     lambda ctx: rm_fingerprint(ctx, Path(ctx.cfg.model.hf_assets_path))),
}


@pytest.mark.parametrize("kind", KEYS)
def test_every_key_is_the_same_in_a_copied_cache(kind, tmp_path):
    """The same entries at the same places in two caches (a copy keeps the files' times: ``cp -a``, ``rsync -a``,
    ``shutil.copytree``; a move keeps everything) give the same key; another entry, another key."""
    overrides, key = KEYS[kind]
    first, copy = tmp_path / "cache", tmp_path / "elsewhere" / "copied-cache"
    _entry(first)
    shutil.copytree(first, copy)
    assert key(_ctx(first, *overrides)) == key(_ctx(copy, *overrides))
    other = Path("pretrained") / "other-v1"
    shutil.copytree(first / ENTRY, copy / other)
    assert key(_ctx(copy, *overrides, entry=other)) != key(_ctx(first, *overrides))


def test_a_cache_dir_reached_through_a_link_is_the_same_cache(tmp_path):
    """A start dir's path is resolved before it is keyed: the cache dir given as a link still names the entry."""
    real = tmp_path / "real-cache"
    _entry(real)
    (tmp_path / "link").symlink_to(real)
    copy = tmp_path / "copy"
    shutil.copytree(real, copy)
    key = KEYS["dpo pairs"][1]
    assert key(_ctx(tmp_path / "link", "algo=dpo")) == key(_ctx(copy, "algo=dpo"))


DEFAULT_SFT_KEYS = {"default": ((), "1fb3a2bb0adf08c0"), "tiny": (tuple(TINY_RUN_OVERRIDES), "ba73ae84e8b608e4")}
"""``sft_fingerprint`` of configs without a path in the cache, as refexp computed them before cache keys wrote such
paths relative to the cache: every user's cached SFT models are found under these keys."""


@pytest.mark.parametrize("name", DEFAULT_SFT_KEYS)
def test_a_config_without_a_path_in_the_cache_keeps_its_sft_key(name, tmp_path):
    overrides, expected = DEFAULT_SFT_KEYS[name]
    for cache in (tmp_path / "cache", Path("~/.cache/refexp")):
        cfg = to_object(compose_root(*overrides, f"sft.cache_dir='{cache}'"))
        ctx = SimpleNamespace(cfg=cfg, task=SimpleNamespace(tokenizer=_tokenizer(cfg.task)), device=torch.device("cpu"))
        assert sft_fingerprint(ctx) == expected


def test_a_start_no_config_names_keeps_its_absolute_path_in_the_keys(tmp_path):
    """The SFT stage's output (``<cache>/sft/<key>``: no config names it) is keyed by its absolute path as before, so
    the DPO pairs, reference tables and reward models cached from it are found; one the config names (a converted
    checkpoint in the cache) by its place in the cache."""
    from refexp.algos.start_key import start_in_key
    from refexp.config.model import model_identity
    from refexp.reference.refcache import checkpoint_stamp

    cache = tmp_path / "cache"
    start = cache / "sft" / "0123456789abcdef"
    start.mkdir(parents=True)
    (start / "sft.json").write_text("{}")
    cfg = to_object(compose_root("algo=dpo", f"sft.cache_dir={cache}"))
    ctx = SimpleNamespace(cfg=cfg, task=SimpleNamespace(max_new_tokens=cfg.task.max_new_tokens))
    assert start_in_key(cfg, start) == str(start.resolve())
    a = cfg.algo  # the pairs' key as it was before cache keys wrote paths relative to the cache
    assert pairs_key(ctx, start) == {
        "task": task_fingerprint(cfg.task), "start": {"path": str(start.resolve()), "stamp": checkpoint_stamp(start)},
        "model": model_identity(cfg.model), "dtype": cfg.training.dtype, "num_pairs": a.num_pairs,
        "pair_seed": a.pair_seed, "max_new_tokens": cfg.task.max_new_tokens}
    converted = _entry(cache)
    named = to_object(compose_root("model=smollm2_135m", "algo=dpo", f"model.hf_assets_path={converted}",
                                   f"sft.cache_dir={cache}"))
    assert start_in_key(named, converted) == f"${{sft.cache_dir}}/{ENTRY}"
