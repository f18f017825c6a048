"""The memory plan's activation formula (``memory_activations.block_activation_elems``) against a count of what
autograd saves for backward in one decoder block: every tensor a ``saved_tensors_hooks`` pack hook sees while the second
block of a 2-block model runs forward, once per storage, parameters and buffers (RoPE tables) left out, per
token. Qwen3-0.6B's block (queries 2048 wide against dim 1024, QK-norm) and a Llama block with grouped KV heads
(4 query heads per KV head, as Llama-3.1-8B), at a small vocabulary."""

from __future__ import annotations

import pytest
import torch

from refexp import titan
from refexp.cli.memory_activations import block_activation_elems
from refexp.cli.memory_shapes import model_shapes
from refexp.config import ModelConfig, ParallelismConfig, TrainingConfig

TOLERANCE = 0.05
TOKENS = 64
MODELS = {
    "qwen3-0.6B block": dict(name="qwen3", flavor="0.6B"),
    "llama GQA block": dict(name="llama3", flavor="8B", dim=1024, n_heads=8, n_kv_heads=2, ffn_hidden_dim=3584),
}


def saved_per_token(model_cfg: ModelConfig, block: int = 1) -> float:
    """Elements autograd keeps for backward in decoder block ``block``, per token (float32, no checkpointing)."""
    torch.manual_seed(0)
    model = titan.build_model(model_cfg, vocab_size=model_cfg.vocab_size, device="cpu", training_cfg=TrainingConfig())
    skip = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    where = {"block": None}
    for i, layer in enumerate(titan.unwrap.decoder_of(model).layers.values()):
        layer.register_forward_pre_hook(lambda mod, args, i=i: where.__setitem__("block", i))
        layer.register_forward_hook(lambda mod, args, out: where.__setitem__("block", None))
    counted: dict[int, int] = {}  # storage -> elements; a storage first saved outside the block is not its own
    seen: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in skip and ptr not in seen:
            seen.add(ptr)
            if where["block"] == block:
                counted[ptr] = storage.nbytes() // t.element_size()
        return t

    tokens = torch.randint(1, model_cfg.vocab_size, (1, TOKENS))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = titan.token_logprobs(model, tokens)  # kept alive: its graph holds what was saved
    assert out.requires_grad and counted
    return sum(counted.values()) / TOKENS


@pytest.mark.parametrize("name", MODELS)
def test_the_activation_formula_matches_what_one_block_saves(name):
    cfg = ModelConfig(**MODELS[name], n_layers=2, vocab_size=512, max_seq_len=2 * TOKENS)
    formula = block_activation_elems(model_shapes(cfg, ParallelismConfig()))
    assert formula == pytest.approx(saved_per_token(cfg), rel=TOLERANCE)
