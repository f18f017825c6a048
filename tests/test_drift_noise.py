"""bench/drift_noise.py: each run's relative standard error of its final drift under both estimators, from the
per-prompt contributions its last evaluation wrote."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np

from refexp.record.metrics import MetricsWriter
from refexp.record.outcomes import EvalOutcomes, append_outcomes

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("drift_noise", ROOT / "bench" / "drift_noise.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(root: Path, name: str, k3: list[float], exact: list[float]) -> None:
    run_dir = root / name
    run_dir.mkdir(parents=True)
    log = MetricsWriter(run_dir)  # metrics.jsonl marks a run dir
    log.write({"step": 10, "kl/init": float(np.mean(k3)), "kl/init_exact": float(np.mean(exact))})
    log.close()
    ids = list(range(len(k3)))
    append_outcomes(run_dir, 0, [EvalOutcomes("eval", "kl/init", ids, [9.0] * len(k3))])  # step 0: replaced below
    append_outcomes(run_dir, 10, [EvalOutcomes("eval", "kl/init", ids, k3), EvalOutcomes("eval", "kl/init_exact",
                                                                                         ids, exact)])


def test_the_table_gives_each_estimators_relative_error_and_dominant_prompts(tmp_path, capsys):
    """Two runs: the k3 contributions [1, 1, 1, 5] (one prompt 5/8 of the total) and [1, 2, 3, 4]; the exact ones
    less spread. Each row's median is the two runs' relative standard errors' mean, computed by hand."""
    _run(tmp_path, "a", [1.0, 1.0, 1.0, 5.0], [1.5, 1.5, 2.0, 3.0])
    _run(tmp_path, "b", [1.0, 2.0, 3.0, 4.0], [2.0, 2.5, 2.5, 3.0])
    assert _bench().main([str(tmp_path)]) == 0
    rows = {line.split(" | ")[0].strip("| "): line for line in capsys.readouterr().out.splitlines()}

    def rse(x):
        x = np.asarray(x)
        return x.std(ddof=1) / math.sqrt(len(x)) / x.mean()

    k3 = (rse([1, 1, 1, 5]) + rse([1, 2, 3, 4])) / 2
    exact = (rse([1.5, 1.5, 2, 3]) + rse([2, 2.5, 2.5, 3])) / 2
    assert f"| 2 | {k3:.1%} (" in rows["`kl/init`"] and rows["`kl/init`"].endswith("| 2 of 2 |")  # 0.5, 0.4 > 0.2
    assert f"| 2 | {exact:.1%} (" in rows["`kl/init_exact`"]
    ratio = (rse([1.5, 1.5, 2, 3]) / rse([1, 1, 1, 5]) + rse([2, 2.5, 2.5, 3]) / rse([1, 2, 3, 4])) / 2
    assert f"| 2 | {ratio:.2f} (" in rows["`kl/init_exact` / `kl/init`, run by run"]


def test_a_sweep_without_per_prompt_drift_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "r").mkdir()
    MetricsWriter(tmp_path / "r").close()
    assert _bench().main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
