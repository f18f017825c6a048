"""The task's tokenizer against the start model's vocabulary, before any model is built.

The start (``sft.checkpoint``, else ``model.hf_assets_path``) was trained under its own token ids. A tokenizer with
more tokens than its embedding has rows emits ids it has no row for; a refexp checkpoint's embedding of another
size than the model built for the run (``model.vocab_size``, else the tokenizer's size) fails to load with DCP's
size-mismatch traceback. Both are one ``ConfigError`` naming both sizes and both files. A tokenizer of a size the
start takes whose vocabulary differs from the start dir's own ``tokenizer.json`` gives the start other ids than it
learned: a warning naming both.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Optional

from refexp.config import ConfigError

TOKENIZER_FILE = "tokenizer.json"


def start_dir(sft_checkpoint: Optional[str], hf_assets_path: Optional[str]) -> Optional[Path]:
    """The weights the run starts from when the user names them (an SFT cache entry was trained with the task's
    own tokenizer: its key holds the tokenizer's files, ``tasks/fingerprint.py``)."""
    given = sft_checkpoint or hf_assets_path
    return Path(given) if given else None


def start_embedding_rows(path: Path) -> Optional[tuple[int, Path]]:
    """``(rows of the start's token embedding, the file that says so)``: an HF dir's config.json ``vocab_size``, a
    refexp checkpoint's ``.metadata`` (read through the restricted unpickler); None when neither says."""
    from refexp.titan.checkpoint_dirs import dcp_dir, is_hf_dir

    if is_hf_dir(path):
        config = path / "config.json"
        rows = json.loads(config.read_text()).get("vocab_size")
        return (int(rows), config) if isinstance(rows, int) else None
    from refexp.titan.dcp_reader import checked_dcp_metadata

    folder = dcp_dir(path)
    metadata = checked_dcp_metadata(folder).state_dict_metadata
    for name, meta in metadata.items():
        if name.endswith("tok_embeddings.weight") and getattr(meta, "size", None):
            return int(meta.size[0]), folder / ".metadata"
    return None


def check_tokenizer_against_start(tokenizer, tokenizer_path: Optional[str], *, sft_checkpoint: Optional[str],
                                  hf_assets_path: Optional[str], model_vocab_size: Optional[int],
                                  warn: bool = True) -> None:
    """``ConfigError`` when ``tokenizer`` (a ``TextTokenizer``) cannot drive the start model (see the module
    docstring); a warning (``warn``: rank 0's) when it is another vocabulary of a size it takes."""
    start = start_dir(sft_checkpoint, hf_assets_path)
    if start is None or not start.is_dir():
        return  # a missing start is named by the config checks (config.check_start_weights)
    found = start_embedding_rows(start)
    if found is None:
        return
    rows, where = found
    tokens = tokenizer.vocab_size
    mine = (f"task.tokenizer_path={tokenizer_path!r} ({Path(tokenizer_path) / TOKENIZER_FILE}) has" if tokenizer_path
            else "refexp's character tokenizer (task.tokenizer_path=None) has")
    if tokens > rows:
        raise ConfigError(f"{mine} {tokens} tokens but the start model {start} has {rows} embedding rows ({where}): "
                          f"expected the start's own tokenizer ({start / TOKENIZER_FILE}) or one of at most {rows} "
                          f"tokens")
    built = model_vocab_size or tokens
    if not hf_assets_path and where.name == ".metadata" and built != rows:
        what = f"model.vocab_size={model_vocab_size}" if model_vocab_size else f"the tokenizer's {tokens} tokens"
        raise ConfigError(f"{mine} {tokens} tokens, so the model is built with {built} embedding rows "
                          f"({what}), but the start model {start} has {rows} ({where}): expected the tokenizer "
                          f"the start was trained with ({start / TOKENIZER_FILE}) or model.vocab_size={rows}")
    own = start / TOKENIZER_FILE
    if warn and own.is_file() and _vocabulary(own) != _vocabulary_of(tokenizer):
        given = Path(tokenizer_path) / TOKENIZER_FILE if tokenizer_path else "refexp's character tokenizer"
        warnings.warn(f"the tokenizer {given} ({tokens} tokens) is not the start model's own ({own}): the start "
                      f"reads its ids as the tokens it was trained on", stacklevel=2)


def _vocabulary(path: Path) -> dict:
    """token -> id of a ``tokenizer.json``, its added tokens included (what decides which row a text reads)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)


def _vocabulary_of(tokenizer) -> dict:
    return tokenizer.backend.get_vocab(with_added_tokens=True)
