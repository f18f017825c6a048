"""A tiny Qwen3 checkpoint written by ``transformers`` (BPE tokenizer, a ChatML-style chat template, two EOS
ids) and GSM8K-format rows, shared by the pretrained-start and preference-task tests."""

from __future__ import annotations

import torch
import transformers

QUESTIONS = [
    (f"Tom has {a} apples and buys {b} more. How many apples does he have?",
     f"He has {a} + {b} = {a + b} apples.\n#### {a + b}")
    for a, b in [(i % 7 + 1, i % 5 + 2) for i in range(24)]
]
SPECIALS = ["<pad>", "<eos>", "<|im_start|>", "<|im_end|>", "<unk>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
SYSTEM = "You are a careful math tutor."
MODEL = ["model=qwen3_debug", "model.max_seq_len=256", "model.dim=null", "model.ffn_hidden_dim=null",
         "model.n_heads=null", "model.n_kv_heads=null"]


def qwen3_checkpoint(path):
    """A tiny Qwen3 in HF format, a BPE tokenizer with a chat template, and two eos ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([q + "\n" + a for q, a in QUESTIONS] + ["system user assistant <think></think>", SYSTEM],
                            trainer)
    path.mkdir(parents=True)
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>",
                                                  chat_template=CHAT_TEMPLATE)
    hf_tok.save_pretrained(path)
    eos, im_end = tok.token_to_id("<eos>"), tok.token_to_id("<|im_end|>")
    cfg = transformers.Qwen3Config(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   max_position_embeddings=256, tie_word_embeddings=True, eos_token_id=eos)
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    transformers.GenerationConfig(eos_token_id=[eos, im_end], pad_token_id=tok.token_to_id("<pad>")
                                  ).save_pretrained(path)
    return eos, im_end
