"""Two pins of the report's statistics (refexp/report/statistics/bootstrap.py, inference.py) on the bootstrap
path: a family's verdict interval is read at Bonferroni's 1 - alpha/m, and the bootstrap is paired (one prompt
draw for both arms), so positively correlated arms get a narrower interval than an unpaired bootstrap would."""

from __future__ import annotations

import numpy as np
import pytest

from refexp.report.statistics.bootstrap import paired_hierarchical_bootstrap
from refexp.report.statistics.inference import family_verdicts


def _correlated_runs(seeds: int, prompts: int, effect: float, rng: np.random.Generator) -> dict:
    """``{seed: (arm, baseline)}``: prompts differ widely in difficulty, which both arms share; the arm adds
    ``effect`` and a little noise of its own (correlation ~0.99 between the arms' scores)."""
    runs = {}
    for s in range(seeds):
        base = rng.uniform(0.0, 1.0, prompts)
        runs[s] = (base + effect + rng.normal(0.0, 0.05, prompts), base)
    return runs


def test_the_bootstrap_verdict_interval_is_read_at_bonferronis_level():
    rng = np.random.default_rng(0)
    results = {f"arm{i}": paired_hierarchical_bootstrap(_correlated_runs(3, 60, 0.02 * i, rng), n_boot=4000, seed=i)
               for i in range(4)}
    verdicts = family_verdicts(results, alpha=0.05)
    for label, v in verdicts.items():
        reps = results[label].replicates
        want = tuple(np.quantile(reps, [0.05 / 4 / 2, 1 - 0.05 / 4 / 2]))  # (1 - alpha/m), m = 4
        assert v.interval == pytest.approx(want, abs=0, rel=1e-12)
        unadjusted = np.quantile(reps, [0.025, 0.975])
        assert v.interval[0] < unadjusted[0] and v.interval[1] > unadjusted[1]
        assert "98.75% interval" in v.sentence("base")


def test_positively_correlated_arms_get_a_narrower_paired_interval_than_an_unpaired_one():
    rng = np.random.default_rng(1)
    runs = _correlated_runs(4, 200, 0.03, rng)
    paired = paired_hierarchical_bootstrap(runs, n_boot=4000, seed=0)
    paired_width = paired.interval[1] - paired.interval[0]

    # the unpaired bootstrap of the same data: seeds drawn alike, each arm's prompts drawn on their own
    draw = np.random.default_rng(2)
    reps = []
    for _ in range(4000):
        seeds = draw.integers(0, len(runs), len(runs))
        diffs = []
        for s in seeds:
            arm, base = runs[int(s)]
            diffs.append(arm[draw.integers(0, len(arm), len(arm))].mean()
                         - base[draw.integers(0, len(base), len(base))].mean())
        reps.append(np.mean(diffs))
    unpaired_width = float(np.subtract(*np.quantile(reps, [0.975, 0.025])))

    assert paired_width < 0.5 * unpaired_width
    assert paired.point == pytest.approx(np.mean([(a - b).mean() for a, b in runs.values()]), abs=1e-12)
