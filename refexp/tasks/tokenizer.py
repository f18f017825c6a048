"""``TextTokenizer``: a ``tokenizers.Tokenizer`` plus the special ids the trainer needs.

Two ways in: ``build_char_tokenizer`` (the embedded arithmetic task's ~17-token vocabulary) and
``TextTokenizer.from_dir`` (an HF checkpoint directory's ``tokenizer.json``). ``hf()`` is the same
tokenizer as ``transformers`` loads it (chat templates are rendered by it, ``refexp.tasks.chat``);
``save`` writes a directory that ``from_dir`` and ``transformers.AutoTokenizer`` load back.

Encoding never adds the tokenizer's own post-processor specials (a Llama-3 ``tokenizer.json`` adds
``<|begin_of_text|>`` to every call): prompt and completion are encoded separately and
concatenated by ``batching``, so BOS is added once, explicitly, with ``add_bos=True``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Optional

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from refexp.config import ConfigError

PAD, EOS, BOS = "<pad>", "<eos>", "<bos>"
ARITHMETIC_ALPHABET = "0123456789+-*="
"""The embedded task's characters: digits, the three operators and ``=``."""


class TextTokenizer:
    """Text <-> token ids, with ``eos_id``, ``pad_id`` (falls back to eos) and ``bos_id`` (may be None).

    ``stop_ids`` end generation: ``eos_id`` first, then every other ``eos_token_id`` of the checkpoint's
    ``generation_config.json`` (chat models end a turn with a token other than the tokenizer's eos).
    ``chat_template`` is the Jinja chat template from the checkpoint's tokenizer config, if any;
    ``system_prompt`` and ``chat_template_kwargs`` (``task.*``) are how ``refexp.tasks.chat`` renders it.
    ``directory`` is the checkpoint dir it was loaded from (None for the character tokenizer).
    """

    def __init__(
        self,
        backend: Tokenizer,
        *,
        eos_id: int,
        pad_id: Optional[int] = None,
        bos_id: Optional[int] = None,
        chat_template: Optional[str] = None,
        stop_ids: Iterable[int] = (),
        directory: Optional[str] = None,
    ) -> None:
        self.backend = backend
        self.eos_id = eos_id
        self.stop_ids = tuple(dict.fromkeys([eos_id, *stop_ids]))
        self.directory = directory
        self.system_prompt: Optional[str] = None
        self.chat_template_kwargs: dict = {}
        self._hf = None
        # Padding positions are masked out everywhere, so any id works; eos is what most
        # HF causal-LM checkpoints without a pad token use.
        self.pad_id = eos_id if pad_id is None else pad_id
        self.bos_id = bos_id
        self.chat_template = chat_template

    @property
    def vocab_size(self) -> int:
        """Number of ids, added special tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token(self, token_id: Optional[int]) -> Optional[str]:
        """The string of one id (None for None), e.g. to give chat templates ``eos_token``."""
        return None if token_id is None else self.backend.id_to_token(token_id)

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        """Token ids of ``text``; ``add_bos`` prepends ``bos_id`` (when there is one and the text
        does not already start with it, as a rendered chat template often does)."""
        try:
            ids = self.backend.encode(text, add_special_tokens=False).ids
        except Exception as e:  # the char tokenizer has no <unk>: an unknown character lands here
            raise ValueError(f"cannot tokenize {text!r}: {e}") from e
        if add_bos and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` up to (not including) the first eos; pad, bos and other special tokens
        are dropped, and ids outside the vocabulary (a model's padded embedding rows) are ignored."""
        if hasattr(ids, "tolist"):  # a tensor or array
            ids = ids.tolist()
        ids = list(ids)
        stops = [i for i, t in enumerate(ids) if t in self.stop_ids]
        if stops:
            ids = ids[: stops[0]]
        return self.backend.decode(ids, skip_special_tokens=True)

    def hf(self):
        """This tokenizer as ``transformers`` has it: ``AutoTokenizer.from_pretrained(directory)`` (the
        checkpoint's own class, files and template), else a ``PreTrainedTokenizerFast`` around the backend."""
        if self._hf is None:
            from transformers import AutoTokenizer, PreTrainedTokenizerFast

            if self.directory is not None:
                self._hf = AutoTokenizer.from_pretrained(self.directory, local_files_only=True)
            else:
                specials = {"eos_token": self.token(self.eos_id), "pad_token": self.token(self.pad_id)}
                if self.bos_id is not None:
                    specials["bos_token"] = self.token(self.bos_id)
                self._hf = PreTrainedTokenizerFast(tokenizer_object=self.backend, chat_template=self.chat_template,
                                                   **specials)
        return self._hf

    def save(self, directory: str) -> None:
        """Write every tokenizer file (``tokenizer.json``, ``tokenizer_config.json`` with the special
        tokens and the chat template, ...) through ``hf().save_pretrained``, so ``from_dir`` and
        ``transformers.AutoTokenizer`` both load the directory back."""
        os.makedirs(directory, exist_ok=True)
        self.hf().save_pretrained(directory)

    def generation_ids(self) -> dict:
        """``eos_token_id`` (every stop id; an int when there is one), ``pad_token_id`` and ``bos_token_id``
        for a ``generation_config.json``."""
        eos = self.stop_ids[0] if len(self.stop_ids) == 1 else list(self.stop_ids)
        return {"eos_token_id": eos, "pad_token_id": self.pad_id, "bos_token_id": self.bos_id}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_hf": None}  # rebuilt on demand; keeps copies and pickles small

    @classmethod
    def from_dir(cls, directory: str) -> "TextTokenizer":
        """Load an HF checkpoint directory: ``tokenizer.json`` for the vocabulary, special tokens
        from ``tokenizer_config.json`` overridden by ``special_tokens_map.json`` (transformers'
        precedence), the chat template from ``chat_template.jinja`` or ``tokenizer_config.json``."""
        path = os.path.join(directory, "tokenizer.json")
        if not os.path.isfile(path):
            what = "has no tokenizer.json" if os.path.isdir(directory) else "does not exist"
            raise ConfigError(
                f"tokenizer directory {directory!r} {what}: expected an HF checkpoint directory "
                f"containing tokenizer.json (and tokenizer_config.json naming eos_token)"
            )
        backend = Tokenizer.from_file(path)
        config = _read_json(directory, "tokenizer_config.json")
        specials = {k: config.get(k) for k in ("eos_token", "pad_token", "bos_token")}
        for k, v in _read_json(directory, "special_tokens_map.json").items():
            if k in specials and v is not None:
                specials[k] = v

        def token_id(key: str) -> Optional[int]:
            value = specials[key]
            if isinstance(value, dict):  # serialized AddedToken: {"content": "</s>", ...}
                value = value.get("content")
            if value is None:
                return None
            tid = backend.token_to_id(value)
            if tid is None:
                raise ConfigError(f"tokenizer directory {directory!r}: {key}={value!r} is not in tokenizer.json")
            return tid

        eos_id = token_id("eos_token")
        if eos_id is None:
            raise ConfigError(
                f"tokenizer directory {directory!r}: no eos_token in tokenizer_config.json or "
                f"special_tokens_map.json (generation needs one to stop)"
            )
        return cls(
            backend,
            eos_id=eos_id,
            pad_id=token_id("pad_token"),
            bos_id=token_id("bos_token"),
            chat_template=_chat_template(directory, config),
            stop_ids=_generation_eos_ids(directory, backend.get_vocab_size(with_added_tokens=True)),
            directory=directory,
        )


def build_char_tokenizer(alphabet: str = ARITHMETIC_ALPHABET) -> TextTokenizer:
    """A character-level tokenizer: ``<pad>``=0, ``<eos>``=1, ``<bos>``=2, then one id per character
    of ``alphabet`` in order. A character outside the alphabet makes ``encode`` raise (there is no
    ``<unk>``: on a generated task an unknown character is a bug, not data)."""
    if len(set(alphabet)) != len(alphabet):
        raise ValueError(f"alphabet {alphabet!r} repeats a character")
    specials = [PAD, EOS, BOS]
    vocab = {tok: i for i, tok in enumerate(specials + list(alphabet))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every char
    backend.decoder = decoders.Fuse()  # join without the spaces WordLevel's default decoding inserts
    backend.add_special_tokens([AddedToken(t, special=True) for t in specials])
    return TextTokenizer(backend, eos_id=vocab[EOS], pad_id=vocab[PAD], bos_id=vocab[BOS])


def _read_json(directory: str, name: str) -> dict:
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f"tokenizer directory {directory!r}: {name} is not valid JSON ({e})") from e


def _generation_eos_ids(directory: str, vocab_size: int) -> list[int]:
    """``eos_token_id`` of ``generation_config.json`` (an int or a list; none when the file is absent)."""
    eos = _read_json(directory, "generation_config.json").get("eos_token_id")
    ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    for i in ids:
        if not (isinstance(i, int) and 0 <= i < vocab_size):
            raise ConfigError(f"tokenizer directory {directory!r}: generation_config.json eos_token_id={eos!r} "
                              f"is invalid: expected ids in [0, {vocab_size})")
    return ids


def _chat_template(directory: str, config: dict) -> Optional[str]:
    """transformers >= 4.43 may save the template as its own file; older ones put it in the config,
    either as a string or as a list of named templates (the one named ``default`` is used)."""
    path = os.path.join(directory, "chat_template.jinja")
    if os.path.isfile(path):
        with open(path) as f:
            return f.read()
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None
