"""The output layer at the selected positions only (``titan.token_logprobs(select_BT=...)``): the same
log-probs, entropies and gradients at those positions as the full-logits path, zero elsewhere, and no
[B, T, V] logits in a forward + backward (refexp/titan/logprobs.py, ``_selected_logprobs``)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from refexp import titan
from refexp.titan import logprobs as titan_logprobs
from refexp.titan.unwrap import canonical_name
from tests.helpers.grouped_rows import grouped_ragged_rows
from tests.helpers.models import tiny_model_config

pytestmark = pytest.mark.numerics  # tests/README.md: run under other CPU kernels too

V, B, T = 97, 5, 13


def _model(name: str = "llama3"):
    return titan.build_model(tiny_model_config(name, vocab_size=V), vocab_size=V, device="cpu", seed=0)


def _batch():
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, V, (B, T), generator=g)
    start = torch.tensor([2, 5, 0, 11, 7])  # per row: the first selected column (a completion's start)
    select = torch.arange(T - 1)[None, :] >= start[:, None]
    select[3] = False  # a row with nothing selected
    return tokens, select


def _logp_entropy_grads(model, tokens, select, **kw):
    model.zero_grad(set_to_none=True)
    lp, ent = titan.token_logprobs(model, tokens, temperature=0.7, with_entropy=True, **kw)
    (lp * torch.linspace(0.5, 2.0, T - 1)).sum().backward()  # a weight per column: gradients differ by column
    return lp.detach(), ent, {canonical_name(n): p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("chunk_rows", [None, 4])  # one piece; 4 positions a chunk (checkpointed)
@pytest.mark.parametrize("name", ["llama3", "qwen3"])  # qwen3's debug flavor ties the output layer to the embedding
def test_selected_logprobs_and_gradients_equal_the_full_path(monkeypatch, chunk_rows, name):
    model, (tokens, select) = _model(name), _batch()
    assert (model.tok_embeddings.weight is model.lm_head.weight) == (name == "qwen3")
    full_lp, full_ent, _ = _logp_entropy_grads(model, tokens, select)
    # the full path's gradient of the same loss restricted to the selection
    model.zero_grad(set_to_none=True)
    lp = titan.token_logprobs(model, tokens, temperature=0.7)
    (torch.where(select, lp, 0.0) * torch.linspace(0.5, 2.0, T - 1)).sum().backward()
    full_g = {canonical_name(n): p.grad.clone() for n, p in model.named_parameters()}
    if chunk_rows is not None:
        monkeypatch.setattr(titan_logprobs, "FP32_CHUNK_ELEMENTS", chunk_rows * V)
    lp, ent, g = _logp_entropy_grads(model, tokens, select, select_BT=select)
    zero = torch.zeros(())
    torch.testing.assert_close(lp, torch.where(select, full_lp, zero), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent, torch.where(select, full_ent, zero), atol=1e-6, rtol=1e-6)
    assert not ent.requires_grad  # a metric
    assert g.keys() == full_g.keys()
    for k in g:
        torch.testing.assert_close(g[k], full_g[k], atol=1e-6, rtol=1e-5, msg=k)


def test_selected_logprobs_with_explicit_positions_and_attention_mask():
    """The shared-prompt layout's forward (positions and a [B, T, T] mask) goes through the same selection."""
    model, (tokens, select) = _model(), _batch()
    positions = torch.arange(T).expand(B, T)
    allowed = torch.ones(T, T, dtype=torch.bool).tril().expand(B, T, T)
    kw = dict(positions_BT=positions, allowed_BTT=allowed)
    with torch.no_grad():
        full = titan.token_logprobs(model, tokens, **kw)
        got = titan.token_logprobs(model, tokens, select_BT=select, **kw)
    torch.testing.assert_close(got, torch.where(select, full, 0.0), atol=1e-6, rtol=1e-6)


D = tiny_model_config().dim


class _WidestLogits(TorchDispatchMode):
    """The most rows of any tensor of last dimension V produced by an op (logits, their float32 copies,
    softmax intermediates and their gradients), leaving out the output layer's transposed weight [D, V]
    and its gradient's product of that shape, which do not grow with the positions."""

    def __init__(self):
        super().__init__()
        self.rows = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[-1] == V and tuple(t.shape) != (D, V):
                self.rows = max(self.rows, t.numel() // V)
        return out


def test_forward_and_backward_never_hold_logits_beyond_one_chunk(monkeypatch):
    monkeypatch.setattr(titan_logprobs, "FP32_CHUNK_ELEMENTS", 4 * V)  # 4 positions a chunk
    model, (tokens, select) = _model(), _batch()
    assert int(select.sum()) > 4 * 3 and B * T > 4 * 3
    with _WidestLogits() as seen:
        lp, _ = titan.token_logprobs(model, tokens, temperature=0.7, with_entropy=True, select_BT=select)
        lp.sum().backward()
    assert 0 < seen.rows <= 4, f"a tensor of {seen.rows} rows x V: logits beyond one chunk of 4 positions"


def test_backward_keeps_no_logits_when_there_are_several_chunks(monkeypatch):
    """Each chunk is checkpointed: what autograd saves for backward holds no [*, V] tensor (the chunk's logits
    are recomputed in backward), while one piece (nothing to recompute) keeps its own."""
    model, (tokens, select) = _model(), _batch()

    def saved_logit_rows() -> int:
        rows = []

        def pack(t):
            if t.dim() >= 1 and t.shape[-1] == V and tuple(t.shape) != (D, V) and tuple(t.shape) != (V, D):
                rows.append(t.numel() // V)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            lp = titan.token_logprobs(model, tokens, temperature=0.7, select_BT=select)
        lp.sum().backward()
        return sum(rows)

    assert saved_logit_rows() >= int(select.sum())  # one piece: its logits kept for backward
    monkeypatch.setattr(titan_logprobs, "FP32_CHUNK_ELEMENTS", 4 * V)
    assert saved_logit_rows() == 0


def test_a_selection_of_the_wrong_shape_or_dtype_is_refused():
    model, (tokens, select) = _model(), _batch()
    with pytest.raises(ValueError, match=r"select_BT: expected a bool tensor of shape \(5, 12\)"):
        titan.token_logprobs(model, tokens, select_BT=select[:, 1:])
    with pytest.raises(ValueError, match="select_BT"):
        titan.token_logprobs(model, tokens, select_BT=select.long())


@pytest.mark.parametrize("attention", [None, "mask", "rows"])  # usual rows; shared prompts either way
def test_row_logprobs_with_a_selection_equal_the_unselected(attention):
    """``row_logprobs(select=True)``: the completion mask, or its shared columns (``SharedPrompt.selection``),
    selects; the result in the usual layout is the same."""
    from functools import partial

    from refexp.algos.shared_prompt import row_logprobs, share_groups

    model, G, p, c = _model(), 3, 4, 6
    tokens, mask = grouped_ragged_rows(2, G, p, c, V)  # ragged completions, shared prompts
    shared = None if attention is None else share_groups(tokens, mask, G, pad_id=0, attention=attention)
    if shared is not None:
        sel = shared.selection(mask)
        assert int(sel.sum()) == int(mask.sum()) and sel.numel() > int(sel.sum())
    lp = partial(titan.token_logprobs, model, temperature=0.7, with_entropy=True)
    with torch.no_grad():
        want = row_logprobs(lp, tokens, mask, shared)
        got = row_logprobs(lp, tokens, mask, shared, select=True)
    for w, x in zip(want, got):
        torch.testing.assert_close(x, torch.where(mask, w, 0.0), atol=1e-6, rtol=1e-6)
