"""A GGUF checkpoint as an HF safetensors dir: transformers' own GGUF reader de-quantises it (the ``gguf``
package), and the result is saved as a plain (unquantised) ``LlamaForCausalLM`` with its tokenizer, chat
template and generation config, which ``model.hf_assets_path`` loads like any HF checkpoint.

Quantised weights stay what they were quantised to: de-quantising a Q4_1 file gives the Q4_1 values in
float32, not the weights the GGUF was made from.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from refexp.tasks.reward_model import quiet_transformers


def load_gguf_model(gguf_path: str | Path):
    """``(model, tokenizer)``: transformers' de-quantised float32 model of ``gguf_path`` (eval mode) and its
    tokenizer (chat template included)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    with quiet_transformers():  # a progress bar per tensor otherwise
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    return model.eval(), tokenizer


@torch.no_grad()
def gguf_to_hf(gguf_path: str | Path, out_dir: str | Path) -> None:
    """Write ``out_dir``: config.json, model.safetensors (float32), generation_config.json and the tokenizer
    files (tokenizer.json, tokenizer_config.json, chat_template.jinja) of the GGUF checkpoint ``gguf_path``.

    transformers refuses to save a model loaded from GGUF (its config keeps a ``quantization_config``), so the
    de-quantised tensors are copied into a fresh model of the same config without it; tied embeddings stay
    tied (one tensor in the file, ``tie_word_embeddings`` in config.json)."""
    from transformers import AutoModelForCausalLM

    loaded, tokenizer = load_gguf_model(gguf_path)
    config = copy.deepcopy(loaded.config)
    del config.quantization_config
    config._name_or_path = ""  # the GGUF's internal model name, not a path anyone can load
    with quiet_transformers():
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict(), strict=True)
    plain.generation_config = copy.deepcopy(loaded.generation_config)
    plain.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
