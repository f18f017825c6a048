"""The analyses of committed sweeps (scripts/analysis/) compute what their docs quote: pair_stats.py's statistics of
the DPO pairs (docs/preference-pairs.md), trajectory_matched.py's mid-run reading at a drift (docs/findings.md), and
error_kinds.py's table from a real run's last checkpoint (each kind's rule: tests/test_error_kinds.py,
test_retention_kinds.py)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "analysis"))


def test_pair_stats_counts_differences_and_correct_digits_after_them():
    import pair_stats

    s = pair_stats.pair_stats(["0811", "0359", "1200"], ["0801", "0369", "1200"])
    assert s["pairs"] == 3
    assert s["hamming_distribution"] == {"0": 1 / 3, "1": 2 / 3} and s["hamming_mean"] == 2 / 3
    assert s["first_difference_mean_position"] == 2  # both differ at the third digit
    assert s["share_with_shared_last_character"] == 2 / 3
    # after the first difference: "1" in 0801 (correct), "9" in 0369 (correct): 2 of 2 characters
    assert s["share_of_rejected_chars_after_the_first_difference_that_are_correct"] == 1.0


def test_trajectory_matched_reads_each_run_where_it_passes_the_drift(tmp_path, capsys):
    """tests/helpers/gold_peak_sweeps.py's runs: kl/init = step / 100, so kl/init 0.15 lies halfway in log between
    the evaluations at steps 10 and 20 (log 1.5 / log 2 of the way); the metric is interpolated there per run, and
    the arm's value is the replicates' mean against the baseline's."""
    import trajectory_matched

    from tests.helpers.gold_peak_sweeps import write_run

    assert trajectory_matched.crossing([(0.1, 0.6), (0.2, 0.8)], 0.15) == pytest.approx(
        0.6 + 0.2 * math.log(1.5) / math.log(2))
    assert trajectory_matched.crossing([(0.1, 0.6), (0.2, 0.8)], 0.5) is None
    f = math.log(1.5) / math.log(2)
    for seed in (0, 1):
        write_run(tmp_path, "fixed", 0.5, seed, test=[0.5, 0.6, 0.7, 0.7, 0.7], val=[0.5] * 5, decl={})
        write_run(tmp_path, "ema", 0.5, seed, test=[0.5, 0.6, 0.8 + 0.05 * seed, 0.7, 0.7], val=[0.5] * 5, decl={})
    assert trajectory_matched.main([str(tmp_path), "--at", "0.15"]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["arm"] == "ema" and row["replicates"] == 2
    assert row["difference"] == pytest.approx(f * 0.125)  # ema rises 0.2 + 0.05 seed where fixed rises 0.1


def test_error_kinds_classifies_each_mistake_and_reads_a_run(tmp_path, capsys, monkeypatch):
    import dataclasses

    import error_kinds
    import retention_kinds
    import yaml

    from refexp.run import run
    from tests.helpers.configs import TINY_GRPO_OVERRIDES, TINY_RUN_OVERRIDES, compose_tiny_run

    assert error_kinds.classify("018+025=", "0043") == "correct"
    assert error_kinds.classify("018+025=", "0033") == "missed ones-carry"  # 8+5 carries; the tens forgot it
    assert error_kinds.classify("012+025=", "0047") == "carry added without one"  # 2+5 does not carry
    assert error_kinds.classify("012+025=", "0036") == "other"
    assert error_kinds.classify("012+025=", "x") == "other"
    overrides = [*TINY_RUN_OVERRIDES, *TINY_GRPO_OVERRIDES, "training.steps=1"]
    run(compose_tiny_run(tmp_path, *overrides))
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    error_kinds.main([str(tmp_path), "--prompts", "8"])
    out = capsys.readouterr().out
    line = json.loads(next(x for x in out.splitlines() if x.startswith("{")))
    assert line["checkpoint"] == "step-1" and sum(line.get(k, 0) for k in error_kinds.KINDS) == 8
    assert "| run |" in out  # the group table (no variant override: one group "run")
    seen = []  # the prompts --retention classifies: the default task keeps subtraction out of RL

    def spy(prompt, completion):
        seen.append(prompt)
        return retention_kinds.classify(prompt, completion)

    monkeypatch.setattr(error_kinds, "RETAINED_SKILLS", dataclasses.replace(error_kinds.RETAINED_SKILLS, classify=spy))
    error_kinds.main([str(tmp_path), "--prompts", "8", "--retention"])
    out = capsys.readouterr().out
    line = json.loads(next(x for x in out.splitlines() if x.startswith("{")))
    assert sum(line.get(k, 0) for k in retention_kinds.KINDS) == 8
    assert len(seen) == 8 and all(p[3] == "-" for p in seen), seen
    assert "| run |" in out and "wrote a+b" in out
