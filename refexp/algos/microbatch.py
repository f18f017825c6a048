"""Micro-batching (``training.micro_batch_size``): a step's rows split into forward/backward chunks whose
gradients accumulate into the whole step's.

A chunk's loss is the step's loss function applied to the chunk; weighting it by the chunk's share of
what the step's loss is a mean over (rows for a per-row mean, tokens for a per-token mean) makes the sum
of the weighted chunk losses, and so of their gradients, the whole-batch loss and gradient. The chunk's
metrics combine with the same kind of weights, so a micro-batched step logs the unchunked step's numbers.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch


def row_chunks(n_rows: int, size: int | None, *, multiple: int = 1) -> list[slice]:
    """Consecutive row slices of ``size`` rows (the last may be shorter) covering ``0..n_rows``; one
    slice when ``size`` is None or not smaller than ``n_rows``. ``multiple``: ``size`` must be a multiple
    of it (whole prompt groups), checked here too because a rank's rows are only known at run time."""
    if size is None or size >= n_rows:
        return [slice(0, n_rows)]
    if size < 1 or size % multiple:
        raise ValueError(f"micro-batch size {size} is invalid: expected a positive multiple of {multiple}")
    return [slice(s, min(n_rows, s + size)) for s in range(0, n_rows, size)]


def combine_metrics(chunk_metrics: Sequence[Mapping[str, torch.Tensor | float]],
                    weights: Sequence[Mapping[str, float] | float]) -> dict[str, float]:
    """``sum_c w_c[k] * m_c[k]`` for every key ``k`` (the chunks' shares of the step's mean: each chunk's
    rows or tokens over the step's). A weight may be one number for every key of its chunk."""
    out: dict[str, float] = {}
    for m, w in zip(chunk_metrics, weights):
        for k, v in m.items():
            wk = w if isinstance(w, (int, float)) else w[k]
            out[k] = out.get(k, 0.0) + float(wk) * float(v)
    return out
