"""A GRPO run logs ``kl/init_exact`` and ``kl/init_exact_retain`` at every evaluation, with their per-prompt
contributions in ``eval_outcomes.jsonl``, from ``eval.kl_samples`` completions per prompt; and the option's bad
values are refused before a run."""

from __future__ import annotations

import pytest

from refexp.config import ConfigError, EvalConfig
from refexp.record.metric_names import KL_INIT, KL_INIT_EXACT, KL_INIT_EXACT_RETAIN, KL_INIT_RETAIN
from refexp.record.outcomes import read_outcomes
from refexp.run import run
from tests.helpers.configs import TINY_GRPO_OVERRIDES, compose_tiny_run
from tests.helpers.runs import metrics_by_step


def test_a_grpo_run_logs_the_exact_drift_on_the_trained_and_the_retained_skill(tmp_path, dense_reward):
    """Two samples per prompt: at step 0 (policy = start) each exact drift is 0, at step 2 it is > 0; each
    evaluation's per-prompt contributions (the tiny run's 8 kl prompts) average to the logged value."""
    run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, "training.steps=2", "eval.every=2", "eval.kl_samples=2"))
    rows = metrics_by_step(tmp_path)
    outcomes = {(step, o.metric): o for step, o in read_outcomes(tmp_path)}
    for exact, k3, split in ((KL_INIT_EXACT, KL_INIT, "eval"), (KL_INIT_EXACT_RETAIN, KL_INIT_RETAIN, "retain_eval")):
        assert rows[0][exact] == pytest.approx(0.0, abs=1e-6) and rows[0][k3] == pytest.approx(0.0, abs=1e-6)
        assert rows[2][exact] > 1e-5, (exact, rows[2])
        for step in (0, 2):
            o = outcomes[(step, exact)]
            assert o.split == split and o.prompt_ids == list(range(8))
            assert sum(o.scores) / len(o.scores) == pytest.approx(rows[step][exact], rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_kl_samples_must_be_a_positive_integer(bad):
    with pytest.raises(ConfigError, match=r"eval\.kl_samples=.* is invalid: expected a positive integer"):
        EvalConfig(kl_samples=bad)
