"""Which rows of a data set each training step reads.

Every stage walks its data in epochs, each a fresh permutation keyed by (seed, epoch), and a step
takes the next consecutive slice of that stream, wrapping into the next epoch's permutation. The
order depends on (n, batch size, seed, step) only, so the global batch of a step is the same at any
world size and after a resume; data-parallel ranks then take their slice of it
(``refexp.runtime.distributed.local_slice``).
"""

from __future__ import annotations

import torch


def batch_ids(n: int, batch_size: int, seed: int, step: int) -> list[int]:
    """Row ids of ``step``'s (1-based) global batch of ``batch_size`` rows out of ``n``.

    Epoch e is ``torch.randperm(n)`` with a generator seeded ``seed * 1_000_003 + e``; step s covers
    positions ``(s-1) * batch_size`` to ``s * batch_size - 1`` of the concatenated epochs.
    """
    start = (step - 1) * batch_size
    ids: list[int] = []
    while len(ids) < batch_size:
        epoch, offset = divmod(start + len(ids), n)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
        ids += perm[offset:offset + batch_size - len(ids)].tolist()
    return ids
