"""The memory plan's reference line holds the float32 master a bf16 EMA reference keeps
(``refexp/reference/strategies.py``; ``ReferenceConfig.fp32_master_bytes``): a bf16 policy's EMA reference, and a
``reference.dtype=bfloat16`` EMA over a float32 policy, each plan 2 B + 4 B per parameter; a float32 EMA and a
bf16 fixed reference plan none."""

from __future__ import annotations

import pytest

from refexp.cli import memory_plan
from refexp.cli.dry_run import fill_data_paths
from refexp.config import to_object
from tests.helpers.configs import compose_root

TOY = ["algo=grpo", "model=tiny", "model.dim=128", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2",
       "model.ffn_hidden_dim=512", "model.vocab_size=4096", "model.max_seq_len=128", "training.device=cpu",
       "algo.prompts_per_step=4", "algo.group_size=4", "logger=none"]


def _reference_line(*overrides: str):
    cfg = to_object(fill_data_paths(compose_root(*TOY, *overrides)))
    plan = memory_plan.plan(cfg)
    params = memory_plan.model_shapes(cfg.model, cfg.parallelism).params
    return next(i for i in plan.resident if i.what == "reference"), params


@pytest.mark.parametrize("overrides", [("reference=ema", "training.dtype=bfloat16"),
                                       ("reference=ema", "reference.dtype=bfloat16")],
                         ids=["bf16-policy", "bf16-reference-over-fp32-policy"])
def test_a_bf16_ema_reference_plans_its_float32_master(overrides):
    line, params = _reference_line(*overrides)
    assert line.bytes == params * (2 + 4)
    assert "float32 master" in line.how


@pytest.mark.parametrize("overrides", [("reference=ema",), ("reference=fixed", "reference.dtype=bfloat16")])
def test_no_master_where_none_is_kept(overrides):
    line, params = _reference_line(*overrides)
    assert line.bytes == params * (2 if "reference.dtype=bfloat16" in overrides else 4)
    assert "master" not in line.how
