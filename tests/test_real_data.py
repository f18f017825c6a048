"""The real-data path end to end, on small local files the test makes: an HF Llama checkpoint dir
(weights + tokenizer) as the starting model, GSM8K-format data, SFT then GRPO, HF export at the end."""

from __future__ import annotations

import json

import pytest
import torch

from refexp.record.metrics import read_metrics
from refexp.run import run
from tests.helpers.configs import compose_tiny_run

QUESTIONS = [
    (f"Tom has {a} apples and buys {b} more. How many apples does he have?",
     f"He has {a} + {b} = {a + b} apples.\n#### {a + b}")
    for a, b in [(i % 7 + 1, i % 5 + 2) for i in range(40)]
]


def _hf_checkpoint(path):
    """A tiny Llama in HF format with a BPE tokenizer trained on the questions."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<bos>", "<eos>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([q + " " + a for q, a in QUESTIONS] + ["Question: Answer:"], trainer)
    from tokenizers import decoders

    tok.decoder = decoders.ByteLevel()
    path.mkdir(parents=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}))
    cfg = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                      rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(str(path), safe_serialization=True)


@pytest.mark.slow
def test_gsm8k_from_an_hf_checkpoint_sft_then_grpo_and_export(tmp_path):
    hf = tmp_path / "hf_llama"
    _hf_checkpoint(hf)
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in QUESTIONS))
    run_dir = tmp_path / "run"
    final = run(compose_tiny_run(
        run_dir, "model=llama3_debug", f"model.hf_assets_path={hf}", "model.max_seq_len=256", "model.dim=null",
        "model.ffn_hidden_dim=null", "model.n_heads=null", "model.n_kv_heads=null",
        "task=gsm8k", f"task.train_path={data}", "task.num_eval=8", "task.max_prompt_len=64", "task.max_new_tokens=32",
        "sft.steps=5", "sft.eval_every=5", "sft.batch_size=8",
        "algo=grpo", "algo.prompts_per_step=2", "algo.group_size=2", "training.steps=2",
        "eval.num_prompts=4", "eval.kl_prompts=2", "checkpoint.last_save_in_hf=true",
    ))
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(0.0 <= r["reward/mean"] <= 1.0 for r in rows[1:])
    assert final["step"] == 2
    exported = run_dir / "checkpoint" / "hf"
    assert (exported / "config.json").is_file() and list(exported.glob("*.safetensors"))
    from transformers import LlamaForCausalLM

    LlamaForCausalLM.from_pretrained(str(exported))  # the exported policy loads in transformers
