"""A job's swept settings spell each number one way (``refexp/record/overrides.py``): a sweep job's
``training.lr=0.001`` and the same job rerun by hand as ``training.lr=1e-3`` are one setting, for the report's
groups and for W&B's, and a value is a number exactly where Hydra reads one."""

from __future__ import annotations

import math

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from refexp.components.wandb_conventions import run_info
from refexp.record.overrides import normalised_value, spelled_number, swept_settings

SPELLINGS = ["1e-3", "0.001", "1E-3", "0.0010", "1_000", "+5", "-0", "007", "1.", ".5", "1e3", "1e-5", "0.00001",
             "inf", "-INF", "nan", "1.0", "2", "'1e-3'", "1e-3x", "fixed", "[1,2]", "1_0.2_5"]


@pytest.mark.parametrize("value", SPELLINGS)
def test_a_value_is_a_number_where_hydra_reads_one_and_keeps_its_type(value):
    hydra = OverridesParser.create().parse_override(f"k={value}").value()
    got = spelled_number(value)
    if isinstance(hydra, (int, float)):
        assert type(got) is type(hydra) and (got == hydra or math.isnan(hydra)), (value, got, hydra)
        again = OverridesParser.create().parse_override(f"k={normalised_value(value)}").value()
        assert type(again) is type(hydra) and (again == hydra or math.isnan(hydra))  # the same number, respelled
    else:
        assert got is None and normalised_value(value) == value


def test_one_number_spelled_several_ways_is_one_setting():
    assert {normalised_value(v) for v in ("1e-3", "0.001", "1E-3", "0.0010", "1.0e-3", "+0.001")} == {"0.001"}
    assert {normalised_value(v) for v in ("1e-5", "0.00001")} == {"1e-5"}
    assert normalised_value("1.0") == "1.0" and normalised_value("1") == "1"  # Hydra's float and int: types kept
    assert normalised_value("1_000") == "1000"
    sweep_job = ["algo=grpo", "reference=fixed", "training.lr=0.001", "training.seed=0"]
    rerun = ["algo=grpo", "reference=fixed", "training.lr=1e-3", "training.seed=0"]
    assert swept_settings(sweep_job) == swept_settings(rerun) == {"training.lr": "0.001"}

    common = {"experiment": "cmp", "algo": "grpo", "strategy": "fixed", "task": "arithmetic", "loss_type": None,
              "sweep": "s"}
    assert run_info(**common, overrides=sweep_job)["group"] == run_info(**common, overrides=rerun)["group"] \
        == "cmp/s/fixed training.lr=0.001"
