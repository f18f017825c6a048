"""The task's tokenizer against the start model, before any build (refexp/components/tokenizer_start.py): another
size is one error naming both sizes and files; the same size with another vocabulary, a warning naming both."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch

from refexp.components.tokenizer_start import check_tokenizer_against_start
from refexp.config import ConfigError
from refexp.tasks.tokenizer import TextTokenizer, build_char_tokenizer


def _tokenizer_dir(hf_dir, out, edit):
    """A copy of the start's tokenizer files with ``edit`` applied to tokenizer.json's dict."""
    shutil.copytree(hf_dir, out, ignore=shutil.ignore_patterns("*.safetensors", "config.json"))
    doc = json.loads((out / "tokenizer.json").read_text())
    edit(doc)
    (out / "tokenizer.json").write_text(json.dumps(doc))
    return out


def _more_tokens(doc):
    first = max(doc["model"]["vocab"].values()) + 1 + len(doc["added_tokens"])
    doc["added_tokens"] += [{"id": first + i, "content": f"<extra_{i}>", "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": False, "special": True} for i in range(40)]


def _two_ids_swapped(doc):
    vocab = doc["model"]["vocab"]
    a, b = "a", "b"
    vocab[a], vocab[b] = vocab[b], vocab[a]


def _check(tokenizer, path, **start):
    check_tokenizer_against_start(tokenizer, path and str(path), **{"sft_checkpoint": None, "hf_assets_path": None,
                                                                    "model_vocab_size": None, **start})


def test_a_larger_tokenizer_than_a_pretrained_start_is_refused_naming_both(hf_dir, tmp_path):
    rows = json.loads((hf_dir / "config.json").read_text())["vocab_size"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _check(TextTokenizer.from_dir(str(hf_dir)), hf_dir, hf_assets_path=str(hf_dir))
    assert not [w for w in caught if "tokenizer" in str(w.message)]  # the start's own tokenizer: silent
    big = _tokenizer_dir(hf_dir, tmp_path / "big", _more_tokens)
    tokens = TextTokenizer.from_dir(str(big)).vocab_size
    assert tokens > rows
    with pytest.raises(ConfigError, match=rf"task.tokenizer_path='{big}' \({big}/tokenizer.json\) has {tokens} tokens "
                                          rf"but the start model {hf_dir} has {rows} embedding rows "
                                          rf"\({hf_dir}/config.json\)"):
        _check(TextTokenizer.from_dir(str(big)), big, hf_assets_path=str(hf_dir))


def test_a_same_size_tokenizer_of_another_vocabulary_is_named_in_a_warning(hf_dir, tmp_path):
    other = _tokenizer_dir(hf_dir, tmp_path / "other", _two_ids_swapped)
    tok = TextTokenizer.from_dir(str(other))
    assert tok.vocab_size == TextTokenizer.from_dir(str(hf_dir)).vocab_size
    with pytest.warns(UserWarning, match=rf"the tokenizer {other}/tokenizer.json \(\d+ tokens\) is not the start "
                                         rf"model's own \({hf_dir}/tokenizer.json\)"):
        _check(tok, other, hf_assets_path=str(hf_dir))


def test_a_refexp_checkpoint_of_another_vocabulary_size_is_refused_before_dcp_loads_it(tmp_path):
    import torch.distributed.checkpoint as dcp

    char = build_char_tokenizer()
    start = tmp_path / "sft_out"
    dcp.save({"tok_embeddings.weight": torch.zeros(char.vocab_size + 3, 4)}, checkpoint_id=str(start / "model"))
    with pytest.raises(ConfigError, match=rf"refexp's character tokenizer \(task.tokenizer_path=None\) has "
                                          rf"{char.vocab_size} tokens, so the model is built with {char.vocab_size} "
                                          rf"embedding rows .* but the start model {start} has {char.vocab_size + 3} "
                                          rf"\({start}/model/.metadata\)"):
        _check(char, None, sft_checkpoint=str(start))
    _check(char, None, sft_checkpoint=str(start), model_vocab_size=char.vocab_size + 3)  # the sizes agree
