"""``kl/init_exact`` as a matched axis (``comparison.matched.axis``): accepted by the config and by the report's
check of a saved block, read from each run's final ``kl/init_exact`` and interpolated in log, like ``kl/init``."""

from __future__ import annotations

import pytest

from refexp.config import ComparisonConfig, ConfigError, MatchedConfig
from refexp.report import build_report
from refexp.report.reading.comparison_plan import block_problem
from tests.helpers.frontier_sweeps import BETAS, LEVEL, block, write_run

X = 10 ** (1 / 3)
"""A drift inside every curve's range, between runs on each side."""


def _sweep(root, axis: str) -> None:
    """fixed: kl/init = kl/init_exact = 10^(level - 1) (0.1 .. 100 across beta), accuracy 0.3 + 0.1 per level. drifter:
    10 prompts more on average (9, 10, 11 by seed) at half a decade more exact drift, so on fixed's accuracy-vs-drift
    line at matched kl/init_exact; its k3 kl/init reads no more drift than fixed's (ahead by 0.05 at matched
    kl/init)."""
    decl = {**block(["fixed", "drifter"]), "primary": ["drifter"], "equivalence_margin": 0.05,
            "matched": {"axis": axis, "at": [X]}}
    for seed in (0, 1, 2):
        for beta in BETAS:
            i = LEVEL[beta]
            for arm, shift, more in (("fixed", 0.0, 0), ("drifter", 0.5, 9 + seed)):
                write_run(root, arm, beta, seed, solved=60 + 20 * i + 2 * seed + more, kl=10 ** (i - 1), decl=decl,
                          extra={"kl/init_exact": 10 ** (i - 1 + shift)})


@pytest.mark.parametrize("axis, want", [("kl/init_exact", 0.0), ("kl/init", 0.05)])
def test_the_declared_contrast_reads_the_declared_drift_metric_in_log(tmp_path, axis, want):
    """At matched kl/init_exact the drifter is level with fixed's frontier (exactly 0: each curve read in log
    drift, on which accuracy is linear here); at matched kl/init, the k3 metric of the same runs, it is 0.05 ahead."""
    _sweep(tmp_path, axis)
    row = build_report(tmp_path).frontier.primary.rows[0]
    assert row.result is not None and row.x == X and axis in row.label
    assert row.result.point == pytest.approx(want, abs=1e-9)


def test_the_exact_drift_is_an_allowed_matched_axis_with_any_positive_value():
    base = dict(arm_key="grpo_variant", arms=["fixed", "ema"], baseline="fixed", seeds=[0, 1], primary=["ema"],
                frontier_key="algo.beta")
    assert ComparisonConfig(**base, matched=MatchedConfig(axis="kl/init_exact", at=[1.5])).matched.declared
    with pytest.raises(ConfigError, match=r"comparison\.matched\.at=\[0\.0\] is invalid: .*kl/init_exact in \(0, inf"):
        MatchedConfig(axis="kl/init_exact", at=[0.0])
    saved = {**block(["fixed", "ema"]), "primary": ["ema"], "matched": {"axis": "kl/init_exact", "at": [1.5]}}
    assert block_problem(saved) is None
    assert "kl/init_exact" in block_problem({**saved, "matched": {"axis": "kl/init_exakt", "at": [1.5]}})
