"""``model.lora``: adapters on the policy through torchtitan's ``LoRAConverter`` (refexp/titan/lora.py). Only the
adapters train and only they are in the optimizer; the start checkpoint loads into the frozen base; the HF export
merges the adapters (transformers' logits equal the adapted model's); wrong settings fail in one line before
anything is built; the dry-run plan shows the adapters and no resident reference for ``reference=fixed``."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from refexp import titan
from refexp.cli.dry_run import plan_lines
from refexp.components.optim import build_optimizer
from refexp.config import ConfigError, to_object
from refexp.config.model import LoRAConfig
from refexp.run import validate
from tests.helpers.configs import CONF_DIR, SMALL_GRPO_OVERRIDES, compose_root, compose_small_run
from tests.helpers.models import tiny_model_config

VOCAB = 50


def _lora_model(name: str = "llama3", rank: int = 4, reference_state: str = "none", seed: int = 0, **lora):
    cfg = tiny_model_config(name, vocab_size=VOCAB)
    return cfg, titan.build_model(cfg, vocab_size=VOCAB, device="cpu", seed=seed,
                                  lora=LoRAConfig(rank=rank, **lora), lora_reference=reference_state)


def _randomise_adapters_(model, seed: int = 1) -> None:
    """Adapters far from their start (B = 0 would make the adapted model the base)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in titan.lora.adapted_modules(model).values():
            for part in (m.lora_a, m.lora_b):
                part.weight.copy_(0.2 * torch.randn(part.weight.shape, generator=gen))


def _tokens(seed: int = 4) -> torch.Tensor:
    return torch.randint(0, VOCAB, (3, 12), generator=torch.Generator().manual_seed(seed))


def test_only_the_adapters_train_and_the_optimizer_holds_only_them():
    _, model = _lora_model()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(titan.lora.is_adapter_name(n, reference=False) for n in trainable)
    # wqkv, wo, w1, w2, w3 of 2 blocks: every linear layer of the blocks, not the output layer
    assert len(titan.lora.adapted_modules(model)) == 10 and "lm_head" not in titan.lora.adapted_modules(model)
    optimizers, _ = build_optimizer(model, optimizer="AdamW", lr=1e-2)
    held = {id(p) for opt in optimizers for g in opt.param_groups for p in g["params"]}
    assert held == {id(p) for p in model.parameters() if p.requires_grad}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    titan.token_logprobs(model, _tokens()).sum().backward()
    optimizers.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= trainable  # B moved from 0; the base and everything else did not


def test_the_start_loads_into_the_base_and_the_adapters_start_at_it(tmp_path):
    cfg = tiny_model_config(vocab_size=VOCAB)
    start = titan.build_model(cfg, vocab_size=VOCAB, device="cpu", seed=7)
    titan.save_model_weights(start, tmp_path / "start")
    _, model = _lora_model(seed=3)
    titan.load_weights(model, cfg, tmp_path / "start")
    x = _tokens()
    assert torch.equal(titan.token_logprobs(model, x), titan.token_logprobs(start, x))  # B = 0
    _randomise_adapters_(model)
    assert not torch.allclose(titan.token_logprobs(model, x), titan.token_logprobs(start, x))
    with titan.lora_view(model, titan.lora.BASE):
        assert torch.equal(titan.token_logprobs(model, x), titan.token_logprobs(start, x))


def test_the_adapters_are_drawn_from_the_seed():
    _, a = _lora_model(seed=5)
    _, b = _lora_model(seed=5)
    _, c = _lora_model(seed=6)
    first = lambda m: next(iter(titan.lora.adapted_modules(m).values())).lora_a.weight  # noqa: E731
    assert torch.equal(first(a), first(b)) and not torch.equal(first(a), first(c))
    assert all(torch.count_nonzero(m.lora_b.weight) == 0 for m in titan.lora.adapted_modules(a).values())


@pytest.mark.parametrize("name", ["llama3", "qwen3"])
def test_the_hf_export_merges_the_adapters(tmp_path, name):
    transformers = pytest.importorskip("transformers")
    cfg, model = _lora_model(name, reference_state="adapter")
    _randomise_adapters_(model)
    titan.export_hf(model, cfg, str(tmp_path / "hf"))
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    x = _tokens()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(x).logits.float(), titan.logits(model, x).float(), atol=1e-5, rtol=0)
    with torch.no_grad(), titan.lora_view(model, titan.lora.BASE):  # the adapters are in it: not the base's
        assert not torch.allclose(reloaded(x).logits.float(), titan.logits(model, x).float(), atol=1e-3)


@pytest.mark.parametrize("overrides, message", [
    (["model.lora.rank=40"], "model.lora.rank=40 is invalid: layers.0.attention.qkv_linear.wqkv is 96 x 32, so an "
                             "adapter of it has rank at most 32"),
    (["model.lora.rank=4", "model.lora.target_modules=[wq,wo]"],
     "model.lora.target_modules=['wq', 'wo'] is invalid: 'wq' matches no linear layer of this model"),
    (["model.lora.rank=-1"], "model.lora.rank=-1 is invalid"),
    (["model.lora.rank=4", "reference.offload=true"], "reference.offload=True is invalid with model.lora.rank=4"),
    (["model.lora.rank=4", "rollout.static_decode=true"], "rollout.static_decode=true is invalid with model.lora"),
])
def test_wrong_lora_settings_are_refused_before_anything_is_built(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(compose_small_run(tmp_path, *SMALL_GRPO_OVERRIDES, *overrides))


def test_an_adapted_output_layer_is_read_with_its_adapter_at_selected_positions():
    _, model = _lora_model(target_modules=["lm_head"])
    _randomise_adapters_(model)
    x = _tokens()
    select = torch.zeros(x.shape[0], x.shape[1] - 1, dtype=torch.bool)
    select[:, 5:] = True
    with torch.no_grad():
        full = titan.token_logprobs(model, x)
        torch.testing.assert_close(titan.token_logprobs(model, x, select_BT=select)[select], full[select])
        with titan.lora_view(model, titan.lora.BASE):
            assert not torch.allclose(titan.token_logprobs(model, x, select_BT=select)[select], full[select])


def test_an_adapter_on_a_tied_output_layer_is_refused():
    cfg = tiny_model_config("qwen3", vocab_size=VOCAB)  # qwen3's debug model ties lm_head to the embedding
    with pytest.raises(ConfigError, match="lm_head is tied to the token embedding"):
        titan.lora_targets(titan.build_model_spec(cfg, vocab_size=VOCAB).model,
                           LoRAConfig(rank=2, target_modules=["lm_head"]))
    spec = titan.build_model_spec(tiny_model_config(vocab_size=VOCAB), vocab_size=VOCAB)  # llama3: untied
    assert [t[0] for t in titan.lora_targets(spec.model, LoRAConfig(rank=2, target_modules=["lm_head"]))] == ["lm_head"]


def test_lora_outside_grpo_is_refused():
    with pytest.raises(ConfigError, match="model.lora.rank=4 is invalid with algo=dpo"):
        to_object(compose_root("algo=dpo", "model.lora.rank=4"))


def test_a_wrong_lora_target_is_one_error_line_from_the_command_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "refexp", f"--config-dir={CONF_DIR}", "algo=grpo",
                           "model.lora.rank=4", "model.lora.target_modules=[wq]", f"run_dir={tmp_path / 'run'}"],
                          capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("refexp: error: model.lora.target_modules=['wq'] is invalid")
    assert not (tmp_path / "run" / "checkpoint").exists()


def test_the_dry_run_plan_shows_the_adapters_and_no_reference_copy_for_fixed():
    lines = {what: (b, how) for what, b, how in plan_lines(to_object(compose_root(
        "algo=grpo", "model=qwen3_0.6b", "model.lora.rank=16", "reference=fixed", "dry_run=true")))}
    full = {what: b for what, b, _ in plan_lines(to_object(compose_root(
        "algo=grpo", "model=qwen3_0.6b", "reference=fixed", "dry_run=true")))}
    adapters, how = lines["LoRA adapters"]
    # rank 16 on q/k/v (fused), o, gate, up, down of 28 blocks: 16 x (in + out) each, float32
    assert adapters > 0 and "rank 16" in how
    assert lines["reference"][0] == 0 and "adapters off" in lines["reference"][1]
    assert lines["kl/init anchor"][0] == 0
    assert lines["optimizer state"][0] == pytest.approx(2 * adapters)  # AdamW's 2 float32 moments of the adapters
    assert lines["reference logits"][0] == full["reference logits"] > 0  # the reference forward remains
    assert lines["per-rank peak estimate"][0] < full["per-rank peak estimate"]


def test_the_sft_stage_and_its_cache_key_do_not_see_lora():
    from types import SimpleNamespace

    from refexp.algos.sft import sft_fingerprint

    def key(*overrides):
        cfg = to_object(compose_root("algo=grpo", *overrides))
        return sft_fingerprint(SimpleNamespace(cfg=cfg, task=SimpleNamespace(tokenizer=SimpleNamespace(vocab_size=64)),
                                               device=torch.device("cpu")))

    assert key("model.lora.rank=16", "model.lora.target_modules=[wo]") == key()
