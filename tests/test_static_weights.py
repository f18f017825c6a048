"""rollout.static_decode on an FSDP-wrapped policy (bf16 compute: a 1-rank mesh on CPU, as on one GPU): the
fixed-shape step's weight inputs keep their addresses across generations separated by training steps, which a
CUDA graph needs (refexp/titan/static_weights.py: FSDP's gathered parameters are allocated anew at each
unshard), and they hold the weights of the latest step, not the first generation's."""

from __future__ import annotations

import pytest
import torch

from refexp import titan
from refexp.components import sampler
from refexp.config import ModelConfig, TrainingConfig
from refexp.tasks.tokenizer import build_char_tokenizer
from refexp.titan import static_decode
from tests.helpers.compile_count import CountingBackend

TOK = build_char_tokenizer()
PROMPTS = ["12+34=", "5+6=", "123+456=", "7="]


def _weights(w) -> dict[str, torch.Tensor]:
    """Every tensor the step reads of ``w`` (a PlainStepWeights), by name."""
    out = {"embedding": w.embedding, "lm_head": w.lm_head_W, "norm": w.norm.weight}
    for i, lw in enumerate(w.layers):
        out.update({f"{i}.wqkv": lw.wqkv_W, f"{i}.wo": lw.wo_W, f"{i}.w1": lw.w1_W, f"{i}.w3": lw.w3_W,
                    f"{i}.w2": lw.w2_W, f"{i}.attn_norm": lw.attn_norm.weight, f"{i}.ffn_norm": lw.ffn_norm.weight})
        for n in ("q_norm", "k_norm"):
            if getattr(lw.attention, n) is not None:
                out[f"{i}.{n}"] = getattr(lw.attention, n).weight
    return out


@pytest.fixture
def recorded_steps(monkeypatch):
    """Each static step's weight inputs ({name: (data_ptr, a copy)}), with the step compiled by a counting
    backend from no kept buckets."""
    backend = CountingBackend()
    titan.release_static_buckets()
    monkeypatch.setattr(static_decode, "CPU_BACKEND", backend)
    seen: list[dict] = []
    run = static_decode.StaticBucket.run

    def recording(self, w, tokens_B):
        seen.append({k: (t.data_ptr(), t.detach().clone()) for k, t in _weights(w).items()})
        return run(self, w, tokens_B)

    monkeypatch.setattr(static_decode.StaticBucket, "run", recording)
    yield seen, backend
    titan.release_static_buckets()


@pytest.mark.parametrize("flavor", ["llama3", "qwen3"])
def test_the_static_steps_weight_inputs_keep_their_addresses_across_training_steps(recorded_steps, flavor):
    seen, backend = recorded_steps
    name, extra = ("qwen3", dict(flavor="debugmodel")) if flavor == "qwen3" else ("llama3", {})
    cfg = ModelConfig(name=name, dim=32, n_layers=2, n_heads=2, n_kv_heads=2, ffn_hidden_dim=64, max_seq_len=64,
                      **extra)
    policy = titan.build_model(cfg, vocab_size=TOK.vocab_size, device="cpu", seed=0,
                               training_cfg=TrainingConfig(mixed_precision_param="bfloat16"))
    assert "FSDP" in type(policy).__name__  # wrapped, as on a GPU: unshard gathers the weights per generation
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    lm_head = titan.unwrap.decoder_of(policy).lm_head.weight
    per_generation = []
    for g in range(3):
        if g:  # a training step between generations: the allocator's blocks and the weights change
            titan.token_logprobs(policy, torch.randint(1, TOK.vocab_size, (4, 16))).mean().backward()
            opt.step()
            opt.zero_grad()
        seen.clear()
        sampler.generate(policy, TOK, PROMPTS, max_new_tokens=4, keys=[(0, g, i, 0) for i in range(4)],
                         static_decode=True, static_capacity=24)
        assert len(seen) == 3 and all({k: p for k, (p, _) in s.items()} == {k: p for k, (p, _) in seen[0].items()}
                                      for s in seen)
        per_generation.append(seen[0])
        # the step reads this step's weights (in the compute dtype), not a stale copy of the first generation's
        current = lm_head.full_tensor() if hasattr(lm_head, "full_tensor") else lm_head
        assert torch.equal(per_generation[-1]["lm_head"][1], current.detach().to(torch.bfloat16))
    ptrs = [{k: p for k, (p, _) in s.items()} for s in per_generation]
    assert ptrs[0] == ptrs[1] == ptrs[2]
    assert not torch.equal(per_generation[0]["0.wqkv"][1], per_generation[2]["0.wqkv"][1])  # they were trained
    assert backend.graphs == 1  # one bucket, compiled once: fixed inputs, no recompilation
