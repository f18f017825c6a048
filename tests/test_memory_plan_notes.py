"""The memory plan's lines that depend on the layout rather than on a count at toy size: FSDP's reduce-scatter
buffer of the lm_head unit, the kl/init anchor beside a reference in another dtype, and the warning when
``rollout.static_decode``'s kept buffers outweigh the model's own memory (``refexp/cli/memory_plan.py``)."""

from __future__ import annotations

import pytest

from refexp.cli import memory_plan
from refexp.cli.dry_run import dry_run, fill_data_paths
from refexp.cli.memory_shapes import model_shapes
from refexp.config import to_object
from tests.helpers.configs import compose_root

GIB = 2**30
QWEN_8X = ["dry_run=true", "algo=grpo", "model=qwen3_0.6b", "task=gsm8k", "training.device=cuda",
           "parallelism=fsdp", "parallelism.nproc_per_node=8"]
LLAMA_1 = ["dry_run=true", "algo=grpo", "model=llama3_8b", "task=gsm8k", "training.device=cuda"]


def _line(overrides, name):
    return dry_run(compose_root(*overrides))[name]


def test_the_lm_head_reduce_scatter_buffer_adds_what_it_exceeds_the_gradients_not_yet_computed_by(capsys):
    """FSDP copies the lm_head unit's unsharded gradient into a float32 buffer at the start of backward, when the
    other units' (sharded) gradients do not exist yet: 8 ranks of Qwen3-0.6B (tied embedding, a quarter of the
    model in that unit) hold more of it than of those gradients; one rank's gradients outweigh it."""
    cfg = to_object(fill_data_paths(compose_root(*QWEN_8X)))
    s = model_shapes(cfg.model, cfg.parallelism)
    buffer, not_yet = s.head_params * 4, (s.params - s.head_params) * 4 / 8
    added = _line(QWEN_8X, "lm_head unit reduce-scatter")
    assert added == pytest.approx(buffer - not_yet) and added > 0.3 * GIB
    assert _line(QWEN_8X[:-2], "lm_head unit reduce-scatter") == 0
    assert _line(LLAMA_1, "lm_head unit reduce-scatter") == 0
    assert "float32 copy of its gradient" in capsys.readouterr().out


def test_a_bfloat16_reference_halves_but_the_anchor_stays_in_the_policy_dtype_and_the_plan_says_why(capsys):
    fp32 = dry_run(compose_root(*LLAMA_1))
    out32 = capsys.readouterr().out
    bf16 = dry_run(compose_root(*LLAMA_1, "reference.dtype=bfloat16"))
    out16 = capsys.readouterr().out
    assert fp32["kl/init anchor"] == 0 and "the fixed reference itself" in out32
    assert bf16["reference"] == fp32["reference"] / 2 and bf16["kl/init anchor"] == fp32["parameters"]
    assert "kl/init is measured in the policy's dtype for every strategy" in out16


def test_static_decode_buffers_over_the_model_memory_print_a_warning(capsys):
    one = ["dry_run=true", "algo=grpo", "model=qwen3_0.6b", "task=gsm8k", "training.device=cuda",
           "rollout.static_decode=true"]
    plan = dry_run(compose_root(*one))
    out = capsys.readouterr().out
    model = plan["parameters"] + plan["optimizer state"] + plan["gradients"]
    assert plan[memory_plan.STATIC_BUFFERS] > model
    assert out.rstrip("\n").splitlines()[-1].startswith("warning: rollout.static_decode keeps "
                                                        f"{plan[memory_plan.STATIC_BUFFERS] / GIB:.2f} GiB")
    small = dry_run(compose_root(*one, "task.max_prompt_len=64", "task.max_new_tokens=64", "eval.num_prompts=16",
                                 "eval.kl_prompts=16"))
    assert small[memory_plan.STATIC_BUFFERS] < small["parameters"] and "warning" not in capsys.readouterr().out
