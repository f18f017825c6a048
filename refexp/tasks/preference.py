"""Preference pairs for DPO, as ``prompt``/``chosen``/``rejected`` strings, from any source
``files.load_table`` opens (local file or folder, Hub id); the three column names are configurable.

Two row formats are accepted (TRL's names: "standard" and "conversational"):
(a) ``prompt``, ``chosen``, ``rejected`` are text; the completions continue the prompt.
(b) ``chosen`` and ``rejected`` are chat ``messages`` lists of ``{"role", "content"}``, with either
    an explicit ``prompt`` messages list, or none: then both conversations must share all but their
    last message (the prompt) and end with an assistant message (the completion).

Chats are rendered with the tokenizer's chat template, else the ``role: content\\n`` fallback of
``refexp.tasks.chat``. As in TRL's ``apply_chat_template``, the prompt is rendered with the
generation prompt, prompt+completion are rendered whole, and the prompt is their common prefix, so
a template that renders a turn differently at the end of a conversation still splits cleanly.
"""

from __future__ import annotations

import os
from typing import Optional

import datasets

from refexp.config import ConfigError
from refexp.tasks.chat import render_chat
from refexp.tasks.files import load_table, require_columns
from refexp.tasks.tokenizer import TextTokenizer

_EXPECTED = ("columns prompt/chosen/rejected as non-empty text, or chosen/rejected as chat messages "
             "lists of {role, content} (with an optional prompt messages list)")


def load_preference(
    path: str, tokenizer: Optional[TextTokenizer] = None, *, split: Optional[str] = None,
    config: Optional[str] = None, columns: tuple[str, str, str] = ("prompt", "chosen", "rejected"),
    cache_dir: Optional[str] = None,
) -> datasets.Dataset:
    """``prompt``/``chosen``/``rejected`` text rows of preference data (see ``files.load_table`` for
    ``split``/``config``); ``columns`` are the source's names of those three. A malformed row raises
    ConfigError naming the source, the row index and what was expected."""
    ds = load_table(path, split=split, config=config, cache_dir=cache_dir)
    renames = {c: std for c, std in zip(columns, ("prompt", "chosen", "rejected")) if c != std and c in ds.column_names}
    # Clear the standard names first: a source may hold both (e.g. a "prompt" id next to a "question" text).
    ds = ds.remove_columns([std for std in renames.values() if std in ds.column_names]).rename_columns(renames)
    require_columns(ds, path, ("chosen", "rejected"), _EXPECTED if columns == ("prompt", "chosen", "rejected")
                    else f"{_EXPECTED} (here named {', '.join(columns)})")

    def convert(row: dict, index: int) -> dict:
        def fail(problem: str) -> ConfigError:
            return ConfigError(f"{path}: row {index}: {problem}; expected {_EXPECTED}")

        prompt, chosen, rejected = row.get("prompt"), row["chosen"], row["rejected"]
        if isinstance(chosen, str) and isinstance(rejected, str):
            for name, value in (("prompt", prompt), ("chosen", chosen), ("rejected", rejected)):
                if not isinstance(value, str) or not value:
                    raise fail(f"{name} is {value!r}")
            return {"prompt": prompt, "chosen": chosen, "rejected": rejected}
        if not (isinstance(chosen, list) and isinstance(rejected, list)):
            raise fail(f"chosen and rejected are {type(chosen).__name__} and {type(rejected).__name__}")
        for name, messages in (("prompt", prompt), ("chosen", chosen), ("rejected", rejected)):
            if messages is not None and (problem := _messages_problem(messages)):
                raise fail(f"{name}: {problem}")
        if prompt is None:  # implicit prompt: the shared conversation before the last message
            if not chosen or not rejected or chosen[:-1] != rejected[:-1]:
                raise fail("chosen and rejected do not share all messages but their last")
            for name, messages in (("chosen", chosen), ("rejected", rejected)):
                if messages[-1]["role"] != "assistant":
                    raise fail(f"the last {name} message has role {messages[-1]['role']!r}, not 'assistant'")
            prompt, chosen, rejected = chosen[:-1], chosen[-1:], rejected[-1:]
        if not prompt or not chosen or not rejected:
            raise fail("an empty messages list")
        try:
            return dict(zip(("prompt", "chosen", "rejected"), _render_pair(prompt, chosen, rejected, tokenizer)))
        except Exception as e:  # a chat template's raise_exception, or its own bugs
            raise fail(f"the chat template failed: {e}") from e

    # keep_in_memory: no cache file is written next to the user's data (a saved dir may be read-only).
    ds = ds.map(convert, with_indices=True, remove_columns=ds.column_names, keep_in_memory=True)
    return ds.select_columns(["prompt", "chosen", "rejected"])  # map keeps reused names first


def _messages_problem(messages) -> Optional[str]:
    """What is wrong with a chat messages value, or None."""
    if not isinstance(messages, list):
        return f"{type(messages).__name__} instead of a messages list"
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            return f"message {i} is {m!r}, not {{'role': str, 'content': str}}"
    return None


def _render_pair(prompt: list, chosen: list, rejected: list, tokenizer) -> tuple[str, str, str]:
    # Arrow gives every message the union of keys in the file (missing ones None): keep role/content.
    prompt, chosen, rejected = ([{"role": m["role"], "content": m["content"]} for m in x]
                                for x in (prompt, chosen, rejected))
    prompt_text = render_chat(prompt, tokenizer, add_generation_prompt=prompt[-1]["role"] != "assistant")
    full_chosen = render_chat(prompt + chosen, tokenizer)
    full_rejected = render_chat(prompt + rejected, tokenizer)
    n = len(os.path.commonprefix([prompt_text, full_chosen, full_rejected]))
    return prompt_text[:n], full_chosen[n:], full_rejected[n:]

