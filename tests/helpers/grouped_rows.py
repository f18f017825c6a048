"""GRPO-shaped token rows for log-prob tests: groups of completions sharing one prompt, ragged lengths."""

from __future__ import annotations

import torch


def grouped_ragged_rows(groups: int, group_size: int, prompt_len: int, completion_len: int, vocab: int,
                        seed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [groups * G, p + c], completion mask [groups * G, p + c - 1]): each group's G rows share a prompt;
    row i's completion is ``c - i % 3`` tokens long (the rest is padding), so the mask is ragged."""
    G, p, c = group_size, prompt_len, completion_len
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, vocab, (groups * G, p + c), generator=g)
    tokens[:, :p] = torch.randint(1, vocab, (groups, p), generator=g).repeat_interleave(G, 0)
    mask = torch.zeros(groups * G, p + c - 1, dtype=torch.bool)
    for i in range(groups * G):
        mask[i, p - 1:p - 1 + c - i % 3] = True
    return tokens, mask
