"""Render chat ``messages`` (lists of ``{"role", "content"}``) to text.

With a tokenizer that carries a chat template, the template is rendered the way
``transformers``' ``apply_chat_template`` does it (a sandboxed Jinja environment with
``trim_blocks``/``lstrip_blocks``, ``raise_exception``, ``tojson``, ``strftime_now``, and the special
tokens as variables), so a checkpoint's own format is reproduced without importing transformers.
Without one, the documented fallback is one ``role: content\\n`` line per message, and the generation
prompt is ``assistant: ``.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from refexp.tasks.tokenizer import TextTokenizer

FALLBACK_GENERATION_PROMPT = "assistant: "


def render_chat(
    messages: list[dict], tokenizer: Optional["TextTokenizer"] = None, *, add_generation_prompt: bool = False
) -> str:
    """Text of ``messages``; ``add_generation_prompt`` appends what opens the assistant's turn."""
    template = getattr(tokenizer, "chat_template", None)
    if template is None:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return text + (FALLBACK_GENERATION_PROMPT if add_generation_prompt else "")
    return _compile(template).render(
        messages=messages,
        add_generation_prompt=add_generation_prompt,
        bos_token=tokenizer.token(tokenizer.bos_id) or "",
        eos_token=tokenizer.token(tokenizer.eos_id),
        pad_token=tokenizer.token(tokenizer.pad_id),
    )


@lru_cache(maxsize=8)
def _compile(template: str):
    # Templates from the Hub are untrusted code: the immutable sandbox is what transformers uses.
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # Jinja's own tojson escapes HTML characters, which changes the rendered prompt.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)
