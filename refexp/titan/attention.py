"""The attention backend of a refexp model: SDPA (``MaskedSDPA``) instead of torchtitan's flex default.

Flex attention has no backward on CPU (docs/torchtitan-notes.md §3), and torchtitan's own SDPA
refuses ``attention_masks``; ``MaskedSDPA`` takes a dense boolean mask through the decoder's
forward (§10), which prompt sharing (``refexp/algos/shared_prompt.py``) depends on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel
from torchtitan.models.common import FlexAttention, ScaledDotProductAttention, VarlenAttention


class MaskedSDPA(ScaledDotProductAttention):
    """torchtitan's SDPA inner attention, which also takes a dense boolean mask.

    ``attention_masks=None`` (every ordinary forward) is torchtitan's own causal path, unchanged.
    A bool tensor ``[B, L, S]`` (True = query may attend to key) goes to SDPA as ``attn_mask``: the
    shared-prompt layout of DPO pairs and GRPO groups (``algos/shared_prompt.py``) needs a mask that
    is not causal by index.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(ScaledDotProductAttention.Config):
        pass

    def forward(self, q_BLNH, k_BLNH, v_BLNH, *, attention_masks=None, scale=None, enable_gqa=False,
                is_causal=True, **kwargs):
        if attention_masks is None:
            return super().forward(q_BLNH, k_BLNH, v_BLNH, scale=scale, enable_gqa=enable_gqa,
                                   is_causal=is_causal, **kwargs)
        if not (isinstance(attention_masks, torch.Tensor) and attention_masks.dtype == torch.bool
                and attention_masks.ndim == 3):
            raise TypeError("MaskedSDPA takes a bool [B, L, S] mask as attention_masks")
        with sdpa_kernel(self.sdpa_backends, set_priority=True):
            out_BNLH = F.scaled_dot_product_attention(
                q_BLNH.transpose(1, 2), k_BLNH.transpose(1, 2), v_BLNH.transpose(1, 2),
                attn_mask=attention_masks.unsqueeze(1), scale=scale, enable_gqa=enable_gqa)
        return out_BNLH.transpose(1, 2)


def _set_attention_backend(cfg, backend: str) -> None:
    """Swap every inner-attention config for ``backend`` (SDPA is the trainable one on CPU:
    docs/torchtitan-notes.md §3).

    SDPA here is causal attention (pad on the right and mask the loss) that also takes an explicit
    mask when one is given (``MaskedSDPA``).
    """
    if backend == "flex":
        return
    new = MaskedSDPA.Config if backend == "sdpa" else VarlenAttention.Config
    for _, _, parent, attr in list(cfg.traverse(FlexAttention.Config)):
        if isinstance(parent, list):
            parent[attr] = new()
        else:
            setattr(parent, attr, new())
