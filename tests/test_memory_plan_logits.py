"""The memory plan's output-layer lines count what ``titan.token_logprobs(select_BT=...)`` holds: the logits of
the tokens the loss reads (GRPO's completion tokens, not the prompts'), at most ``FP32_CHUNK_ELEMENTS // vocab``
positions at once (each chunk recomputed in backward), in the compute dtype and their float32 copy, and with a
gradient their gradients; under TP every position, vocab-sharded (``refexp/cli/memory_activations.py``)."""

from __future__ import annotations

from refexp.cli import memory_plan, memory_rows
from refexp.cli.dry_run import fill_data_paths
from refexp.config import to_object
from refexp.titan.logprobs import FP32_CHUNK_ELEMENTS
from tests.helpers.configs import compose_root

VOCAB = 4096
TOY = ["algo=grpo", "model=tiny", "model.dim=128", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2",
       "model.ffn_hidden_dim=512", f"model.vocab_size={VOCAB}", "model.max_seq_len=256", "training.device=cpu",
       "algo.prompts_per_step=4", "algo.group_size=4", "algo.share_prompt=false", "training.micro_batch_size=8",
       "eval.num_prompts=4", "eval.kl_prompts=4", "logger=none"]
LLAMA_8X = ["dry_run=true", "algo=grpo", "model=llama3_8b", "task=gsm8k", "parallelism=fsdp",
            "parallelism.nproc_per_node=8", "training.device=cuda"]


def _logits(*overrides: str) -> tuple[float, float]:
    """(policy training's logit bytes, the reference forward's) of the plan of ``overrides``."""
    plan = memory_plan.plan(to_object(fill_data_paths(compose_root(*overrides))))
    line = lambda phase, name: next(i for i in plan.phases[phase] if i.what == name).bytes  # noqa: E731
    return line("policy training", "logits and log-probs"), line("reference forward", "reference logits")


def test_grpo_counts_the_completion_tokens_of_one_chunk():
    """8 rows of a 40-token completion, every position in one chunk (4096-token vocabulary), float32 on CPU:
    logits and their float32 copy (the same 4 B twice), doubled by their gradients in training."""
    assert FP32_CHUNK_ELEMENTS // VOCAB >= 8 * 40
    train, ref = _logits(*TOY, "task.max_prompt_len=24", "task.max_new_tokens=40")
    assert train == 8 * 40 * VOCAB * (4 + 4) * 2
    assert ref == 8 * 40 * VOCAB * (4 + 4)
    assert _logits(*TOY, "task.max_prompt_len=96", "task.max_new_tokens=40") == (train, ref)  # prompts: no logits
    longer = _logits(*TOY, "task.max_prompt_len=24", "task.max_new_tokens=80")
    assert longer == (2 * train, 2 * ref)


def test_more_completion_tokens_than_a_chunk_hold_one_chunk():
    """Llama-3.1-8B, 8 ranks: 2 shared rows of 8 completions of 256 tokens is 4096 selected tokens, more than a
    chunk's 2^25 // 128256 = 261: one chunk's bf16 logits and float32 copy, and their gradients, whatever the
    lengths."""
    chunk = FP32_CHUNK_ELEMENTS // 128256
    train, ref = _logits(*LLAMA_8X)
    assert train == chunk * 128256 * (2 + 4) * 2 and ref == chunk * 128256 * (2 + 4)
    assert _logits(*LLAMA_8X, "task.max_new_tokens=128", "task.max_prompt_len=512") == (train, ref)


def test_tensor_parallel_counts_every_position_vocab_sharded():
    """TP falls back to the full logits (``_selected_forward``): every token of the chunk's rows, vocab / t."""
    two_d = [o.replace("parallelism=fsdp", "parallelism=fsdp_tp") for o in LLAMA_8X]
    cfg = to_object(fill_data_paths(compose_root(*two_d)))
    world, rep, shard, tp = memory_plan.layout(cfg)
    assert (world, tp) == (8, 2)
    chunk = memory_rows.training_chunk(cfg, rep * shard)
    rows, length = chunk.rows, chunk.length
    plan = memory_plan.plan(cfg)
    train = next(i for i in plan.phases["policy training"] if i.what == "logits and log-probs")
    assert train.bytes == rows * length * 128256 / 2 * (2 + 4) * 2 and "vocab / 2" in train.how
