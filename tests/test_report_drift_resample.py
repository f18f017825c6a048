"""The drift resample (refexp/report/statistics/drift_resample.py): every run's kl/init is read on one draw of the kl
prompts per replicate, shared by all the runs of a matched contrast (they were all measured on the same prompts),
and each matched contrast prints the share of its bootstrap's variance that this x-noise brings."""

from __future__ import annotations

import json

import numpy as np
import pytest

from refexp.report import build_report
from refexp.report.reading.comparison_plan import make_plan
from refexp.report.reading.load import load_sweep
from refexp.report.statistics import frontier
from refexp.report.statistics.drift_resample import drift_shift
from refexp.report.statistics.frontier_points import DRIFT_AXIS
from tests.helpers.frontier_sweeps import BETAS, LEVEL, block, write_run

X = 10 ** (1 / 3)
"""A kl/init between runs on both curves (beta 0.2 -> 1, 0.04 -> 10)."""


def parallel_sweep(root, same_prompts: bool) -> None:
    """fixed and ema at every beta and seed 0-2 with the same final kl/init (0.1 .. 100), ema 19-21 prompts ahead at
    every beta, so ema's accuracy-vs-drift curve is fixed's moved up. Each run logs 256 per-prompt kl/init
    contributions (a relative spread of 3 per prompt); ``same_prompts``: ema's run at a beta and seed has exactly
    fixed's contributions there (one prompt drives both alike), else its own draw."""
    decl = {**block(["fixed", "ema"]), "primary": ["ema"], "matched": {"axis": "kl/init", "at": [X]},
            "equivalence_margin": 0.05}
    for seed in (0, 1, 2):
        for beta in BETAS:
            i = LEVEL[beta]
            kl = 10.0 ** (i - 1)
            for arm, more in (("fixed", 0), ("ema", 19 + seed)):
                z = np.random.default_rng([seed, i, 0 if same_prompts or arm == "fixed" else 1]).standard_normal(256)
                write_run(root, arm, beta, seed, solved=60 + 20 * i + 2 * seed + more, kl=kl, decl=decl,
                          kl_per_prompt=(kl * (1 + 3.0 * (z - z.mean()) / z.std())).tolist())


def _shift(root) -> np.ndarray:
    runs = load_sweep(root)
    cs = frontier.curves(runs, make_plan(runs), DRIFT_AXIS, "eval/accuracy")
    units = sorted(cs["fixed"])
    return drift_shift(cs["ema"], cs["fixed"], units, X, DRIFT_AXIS.log, DRIFT_AXIS.key, 2000)


def test_runs_with_identical_per_prompt_drift_move_alike_under_the_shared_prompt_draw(tmp_path):
    """Where ema's runs logged exactly fixed's per-prompt contributions, the shared draw moves both curves' x alike,
    and ema's curve being fixed's moved up, the difference at the matched x does not move at all; drawing each
    run's prompts independently would move it (the control: runs with their own contributions do move it)."""
    parallel_sweep(tmp_path / "same", same_prompts=True)
    parallel_sweep(tmp_path / "own", same_prompts=False)
    same, own = _shift(tmp_path / "same"), _shift(tmp_path / "own")
    assert same.shape == own.shape == (2000,)
    np.testing.assert_allclose(same, 0.0, atol=1e-12)  # the same x-values, the ys one rounding apart
    assert own.std() > 0.005  # 0.1 accuracy per decade, the x-values' noise about 0.08 decades: not 0


@pytest.mark.parametrize("same_prompts", [True, False])
def test_each_matched_contrast_prints_its_share_of_variance_due_to_x_noise(tmp_path, same_prompts):
    """The share, Var(shift) / (Var(accuracy) + Var(shift)), lies in [0, 1]: 0 where the runs' shared draw cancels,
    a real part where it does not; the matched texts, the first screen and summary.json print it."""
    parallel_sweep(tmp_path, same_prompts)
    report = build_report(tmp_path)
    primary = report.frontier.primary.rows[0]
    secondary = next(m for m in report.frontier.matched if m.axis.key == "kl/init")
    shares = [primary.x_noise_share] + [r.x_noise_share for r in secondary.rows if r.result is not None]
    assert all(0.0 <= s <= 1.0 for s in shares)
    if same_prompts:
        assert shares == pytest.approx([0.0] * len(shares), abs=1e-12)
    else:
        assert all(s > 0.05 for s in shares)
    sentence = ("Share of each bootstrap's variance due to the kl/init measurement's own prompt noise (x-noise: one "
                "draw of the kl/init prompts per replicate for every run, crossed with the accuracy prompts): ")
    assert sentence + f"ema at kl/init 2.15: {primary.x_noise_share:.2f}." in report.frontier.primary.text
    assert sentence in secondary.text
    first = report.markdown_path.read_text().split("\n## ", 2)[1]
    assert "| x-noise share |" in first and f"| {primary.x_noise_share:.2f} |" in first
    summary = json.loads(report.summary_path.read_text())
    assert summary["primary_contrasts"][0]["x_noise_share"] == pytest.approx(primary.x_noise_share)
    assert summary["frontier"]["primary"]["rows"][0]["x_noise_share"] == pytest.approx(primary.x_noise_share)
