"""The attention backend of a refexp model: SDPA (``MaskedSDPA``) instead of torchtitan's flex default.

Flex attention has no backward on CPU (docs/torchtitan-notes.md §3), and torchtitan's own SDPA
refuses ``attention_masks``; ``MaskedSDPA`` takes a dense boolean mask through the decoder's
forward (§10), which prompt sharing (``refexp/algos/shared_prompt.py``) depends on, or the gather
indices of ``CausalRows``: the same attention computed as causal attention over the usual rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel
from torchtitan.models.common import FlexAttention, ScaledDotProductAttention, VarlenAttention


@dataclass(frozen=True)
class CausalRows:
    """A shared row's attention as causal attention over the usual rows (``algos/shared_prompt.py``).

    In the shared layout every query sees exactly what it would see in its usual row: the keys of that
    row's earlier positions. So the usual rows' queries/keys/values can be gathered out of the shared
    rows, attended causally (no mask: SDPA's causal kernel), and each shared slot takes the output of
    the one usual position it stands for. This costs N x T^2 query-key pairs against the dense mask's
    U x S^2 (plus the gathers): far fewer when many long completions share a prompt.

    gather_NT: [N, T] long, index into the flattened shared rows (u * S + s) of usual row n's column t
               (columns past the row's end repeat a valid slot; being last, causal attention keeps
               them from every real query).
    owner_US:  [U, S] long, index into the flattened usual rows (n * T + t) of the position whose
               output shared slot s of row u takes (padding slots take any real position's).
    """

    gather_NT: torch.Tensor
    owner_US: torch.Tensor

    def attend(self, q_BLNH, k_BLNH, v_BLNH, *, scale=None, enable_gqa=False) -> torch.Tensor:
        """Attention of the shared rows [U, S, heads, head_dim] -> [U, S, heads, head_dim]."""
        U, S = self.owner_US.shape
        N, T = self.gather_NT.shape
        idx = self.gather_NT.reshape(-1)

        def usual(x_USNH):  # [U, S, n, H] -> [N, n, T, H]
            return x_USNH.reshape(U * S, *x_USNH.shape[2:])[idx].view(N, T, *x_USNH.shape[2:]).transpose(1, 2)

        out_NnTH = F.scaled_dot_product_attention(usual(q_BLNH), usual(k_BLNH), usual(v_BLNH), is_causal=True,
                                                  scale=scale, enable_gqa=enable_gqa)
        n, H = out_NnTH.shape[1], out_NnTH.shape[3]
        out_PnH = out_NnTH.transpose(1, 2).reshape(N * T, n, H)  # P = N * T usual positions
        return out_PnH[self.owner_US.reshape(-1)].view(U, S, n, H)


class MaskedSDPA(ScaledDotProductAttention):
    """torchtitan's SDPA inner attention, which also takes a dense boolean mask.

    ``attention_masks=None`` (every ordinary forward) is torchtitan's own causal path, unchanged.
    A bool tensor ``[B, L, S]`` (True = query may attend to key) goes to SDPA as ``attn_mask``: the
    shared-prompt layout of DPO pairs and GRPO groups (``algos/shared_prompt.py``) needs a mask that
    is not causal by index. A ``CausalRows`` computes the same attention from gathered usual rows.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(ScaledDotProductAttention.Config):
        pass

    def forward(self, q_BLNH, k_BLNH, v_BLNH, *, attention_masks=None, scale=None, enable_gqa=False,
                is_causal=True, **kwargs):
        if attention_masks is None:
            return super().forward(q_BLNH, k_BLNH, v_BLNH, scale=scale, enable_gqa=enable_gqa,
                                   is_causal=is_causal, **kwargs)
        if isinstance(attention_masks, CausalRows):
            with sdpa_kernel(self.sdpa_backends, set_priority=True):
                return attention_masks.attend(q_BLNH, k_BLNH, v_BLNH, scale=scale, enable_gqa=enable_gqa)
        if not (isinstance(attention_masks, torch.Tensor) and attention_masks.dtype == torch.bool
                and attention_masks.ndim == 3):
            raise TypeError("MaskedSDPA takes a bool [B, L, S] mask or a CausalRows as attention_masks")
        with sdpa_kernel(self.sdpa_backends, set_priority=True):
            out_BNLH = F.scaled_dot_product_attention(
                q_BLNH.transpose(1, 2), k_BLNH.transpose(1, 2), v_BLNH.transpose(1, 2),
                attn_mask=attention_masks.unsqueeze(1), scale=scale, enable_gqa=enable_gqa)
        return out_BNLH.transpose(1, 2)


def set_attention_backend(cfg, backend: str) -> None:
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
