"""Render chat ``messages`` (lists of ``{"role", "content"}``) to text.

With a tokenizer that carries a chat template, ``transformers``' ``apply_chat_template`` renders it
(``TextTokenizer.hf()``: the checkpoint's own tokenizer), with the tokenizer's ``system_prompt`` as a
leading system message and its ``chat_template_kwargs`` as template variables (``task.*``). Without
one, the documented fallback is one ``role: content\\n`` line per message, and the generation prompt
is ``assistant: `` (preference data in chat form still needs some text).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from refexp.tasks.tokenizer import TextTokenizer

FALLBACK_GENERATION_PROMPT = "assistant: "


def render_chat(
    messages: list[dict], tokenizer: Optional["TextTokenizer"] = None, *, add_generation_prompt: bool = False
) -> str:
    """Text of ``messages``; ``add_generation_prompt`` appends what opens the assistant's turn."""
    if getattr(tokenizer, "chat_template", None) is None:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return text + (FALLBACK_GENERATION_PROMPT if add_generation_prompt else "")
    system = tokenizer.system_prompt
    if system is not None and not (messages and messages[0]["role"] == "system"):
        messages = [{"role": "system", "content": system}, *messages]
    return tokenizer.hf().apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                              **tokenizer.chat_template_kwargs)


def chat_prompt(text: str, tokenizer: "TextTokenizer") -> str:
    """A prompt with ``text`` as the user message, the assistant's turn opened (a task's question)."""
    return render_chat([{"role": "user", "content": text}], tokenizer, add_generation_prompt=True)


def configure_chat(tokenizer: "TextTokenizer", task_cfg) -> None:
    """Give ``tokenizer`` the ``task.system_prompt`` / ``task.chat_template_kwargs`` it renders with; with
    ``task.chat_template=true`` a tokenizer without a template is a ConfigError."""
    if not task_cfg.chat_template:
        return
    if tokenizer.chat_template is None:
        from refexp.config import ConfigError

        where = (f"task.tokenizer_path={task_cfg.tokenizer_path!r} has" if task_cfg.tokenizer_path
                 else "refexp's character tokenizer (task.tokenizer_path=None) has")
        raise ConfigError(f"task.chat_template=true is invalid: {where} no chat template (chat_template in "
                          f"tokenizer_config.json or chat_template.jinja); expected task.chat_template=false")
    tokenizer.system_prompt = task_cfg.system_prompt
    tokenizer.chat_template_kwargs = dict(task_cfg.chat_template_kwargs)


GSM8K_PROMPT = ("Question: ", "\nAnswer:")
"""The plain GSM8K prompt around the question (``refexp/tasks/gsm8k.py``'s documented format)."""


def chat_rows(ds, tokenizer: "TextTokenizer", task_name: str):
    """``ds`` with every ``prompt`` rendered by ``chat_prompt``: the task's question as the user message
    (gsm8k: the question without ``GSM8K_PROMPT``; arithmetic: the prompt itself). The completion loses
    gsm8k's opening space, which only separates it from a plain prompt's ``Answer:``."""
    head, tail = GSM8K_PROMPT

    def render(row: dict) -> dict:
        prompt, completion = row["prompt"], row["completion"]
        if task_name == "gsm8k":
            if not (prompt.startswith(head) and prompt.endswith(tail)):
                raise ValueError(f"gsm8k prompt {prompt[:80]!r} is not in the format {head!r}...{tail!r}")
            prompt, completion = prompt[len(head):-len(tail)], completion.removeprefix(" ")
        return {"prompt": chat_prompt(prompt, tokenizer), "completion": completion}

    return ds.map(render, keep_in_memory=True)
