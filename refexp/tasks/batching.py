"""Text -> padded token tensors, for sampling (left-padded prompts) and for SFT / DPO (packed
prompt+completion rows with a completion mask). Pure torch; the model side is elsewhere.

Every sequence starts with the tokenizer's BOS when it has one (``TextTokenizer.encode(add_bos=True)``),
so the sampler, SFT and DPO see the same prompt tokens.
"""

from __future__ import annotations

from typing import Optional

import torch

from refexp.tasks.tokenizer import TextTokenizer


def encode_prompts(
    tokenizer: TextTokenizer, prompts: list[str], max_len: Optional[int] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(prompt_BL, prompt_lens_B)``: prompts left-padded with ``pad_id`` to the longest one (L),
    so every row's last prompt token sits at column L-1 and generation appends in lock-step.

    Raises ValueError naming the row when a prompt is longer than ``max_len`` tokens (None: no
    limit); truncating would silently change the question.
    """
    rows = [tokenizer.encode(p, add_bos=True) for p in prompts]
    for i, ids in enumerate(rows):
        if max_len is not None and len(ids) > max_len:
            raise ValueError(f"prompt row {i} has {len(ids)} tokens > max_len={max_len}: {prompts[i][:80]!r}")
    width = max((len(ids) for ids in rows), default=0)
    prompt_BL = torch.full((len(rows), width), tokenizer.pad_id, dtype=torch.long)
    for i, ids in enumerate(rows):
        if ids:
            prompt_BL[i, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
    return prompt_BL, torch.tensor([len(ids) for ids in rows], dtype=torch.long)


def pack_sequences(
    tokenizer: TextTokenizer,
    prompts: list[str],
    completions: list[str],
    *,
    add_eos: bool = True,
    max_len: Optional[int] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens_BT, completion_mask_BT)``: each row is ``[bos] prompt completion [eos]``,
    right-padded with ``pad_id`` to the longest row (T).

    ``completion_mask_BT[b, t]`` is True when ``tokens_BT[b, t]`` is a completion token (or the
    appended eos). A next-token loss predicts ``tokens[:, 1:]`` from ``logits[:, :-1]``, so it
    uses ``completion_mask_BT[:, 1:]``; column 0 is always a prompt token and never masked in.

    Prompt and completion are encoded separately, so the mask boundary is exact even where a
    tokenizer would merge across it. Raises ValueError naming the row when a row is longer than
    ``max_len`` or has no completion tokens at all.
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    rows: list[tuple[list[int], list[int]]] = []
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        p = tokenizer.encode(prompt, add_bos=True)
        c = tokenizer.encode(completion) + ([tokenizer.eos_id] if add_eos else [])
        if not p or not c:
            raise ValueError(f"row {i} has an empty {'prompt' if not p else 'completion'}: a loss needs both")
        if max_len is not None and len(p) + len(c) > max_len:
            raise ValueError(f"row {i} has {len(p)} prompt + {len(c)} completion tokens > max_len={max_len}: "
                             f"{prompt[:80]!r}")
        rows.append((p, c))
    width = max((len(p) + len(c) for p, c in rows), default=0)
    tokens_BT = torch.full((len(rows), width), tokenizer.pad_id, dtype=torch.long)
    completion_mask_BT = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, (p, c) in enumerate(rows):
        tokens_BT[i, : len(p) + len(c)] = torch.tensor(p + c, dtype=torch.long)
        completion_mask_BT[i, len(p): len(p) + len(c)] = True
    return tokens_BT, completion_mask_BT
