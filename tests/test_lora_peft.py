"""An independent oracle for ``model.lora``'s forward: peft's LoRA on the same model in transformers, with the same
adapter weights, gives the same logits as refexp's adapted torchtitan model (refexp/titan/lora.py).

The mapping: refexp's HF export writes the base (the adapters' B starts at 0); each adapter's A is peft's lora_A and
its B, laid out as HF lays out the weight's rows (the export's own row split and Q/K permutation,
``titan.hf_tensors.to_hf_tensors``), is peft's lora_B; peft's scaling is lora_alpha / r, refexp's alpha / rank. A
fused ``wqkv`` adapter (one A, B's rows for q, k and v) is peft's q_proj, k_proj and v_proj adapters sharing that A
(each B its rows): the same weight update ``scale * B A``, exactly.
"""

from __future__ import annotations

import pytest
import torch

from refexp import titan
from refexp.config.model import LoRAConfig
from refexp.titan.hf_tensors import native_export_entries, state_dict_adapter, to_hf_tensors
from tests.helpers.models import tiny_model_config

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

VOCAB, RANK, ALPHA = 50, 4, 12.0  # alpha / rank = 3: a wrong scaling shows


def _hf_rows(adapter, name: str, b: torch.Tensor, module, in_features: int) -> dict[str, torch.Tensor]:
    """B [out, rank] of the adapter on weight ``name``, as HF's weight(s) lay out their rows: B padded with zero
    columns to the weight's shape goes through the export's own conversion (row split, Q/K permutation: row-wise,
    so the columns ride along), and its first ``rank`` columns come back."""
    padded = torch.zeros(b.shape[0], in_features, dtype=b.dtype)
    padded[:, :b.shape[1]] = b
    return {k: v[:, :b.shape[1]].contiguous() for k, v in to_hf_tensors(adapter, name, padded, module).items()}


def _peft_model_with_refexp_adapters(model, cfg, hf_dir):
    """transformers' model of ``hf_dir`` under peft's LoRA (every linear layer of the blocks), its adapters set to
    ``model``'s."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    config = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules="all-linear", bias="none")
    wrapped = peft.get_peft_model(hf, config).eval()
    layers = {name.removeprefix("base_model.model."): m for name, m in wrapped.named_modules()
              if isinstance(m, peft.tuners.lora.LoraLayer)}
    adapter = state_dict_adapter(model, cfg)
    adapted = {f"{n}.weight": m for n, m in titan.lora.adapted_modules(model).items()}
    set_layers = set()
    with torch.no_grad():
        for name, weight, module in native_export_entries(model):
            if name not in adapted:
                continue
            a, b = adapted[name].lora_a.weight.detach(), adapted[name].lora_b.weight.detach()
            for hf_name, b_rows in _hf_rows(adapter, name, b, module, weight.shape[1]).items():
                layer = layers[hf_name.removesuffix(".weight")]
                layer.lora_A["default"].weight.copy_(a)
                layer.lora_B["default"].weight.copy_(b_rows)
                set_layers.add(hf_name)
    assert len(set_layers) == len(layers), "every peft adapter has its refexp counterpart"
    return wrapped


@pytest.mark.parametrize("name", ["llama3", "qwen3"])
def test_refexp_lora_forward_equals_pefts_on_the_same_adapters(tmp_path, name):
    cfg = tiny_model_config(name, vocab_size=VOCAB)
    model = titan.build_model(cfg, vocab_size=VOCAB, device="cpu", seed=0, lora=LoRAConfig(rank=RANK, alpha=ALPHA))
    titan.export_hf(model, cfg, str(tmp_path / "hf"))  # B = 0 at the start: the export is the base
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # adapters far from their start, so the adapted model is far from the base
        for m in titan.lora.adapted_modules(model).values():
            for part in (m.lora_a, m.lora_b):
                part.weight.copy_(0.2 * torch.randn(part.weight.shape, generator=gen))
    wrapped = _peft_model_with_refexp_adapters(model, cfg, str(tmp_path / "hf"))
    x = torch.randint(0, VOCAB, (3, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ours = titan.logits(model, x).float()
        theirs = wrapped(input_ids=x).logits.float()
        with titan.lora_view(model, titan.lora.BASE):
            base = titan.logits(model, x).float()
    assert (ours - base).abs().max() > 0.1  # the adapters matter at this size
    torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=0)
    torch.testing.assert_close(titan.token_logprobs(model, x), torch.log_softmax(theirs, -1)[:, :-1].gather(
        -1, x[:, 1:, None]).squeeze(-1), atol=2e-5, rtol=0)
