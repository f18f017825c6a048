"""The metric registry is the one list of names: ``docs/metrics.md`` is generated from it, and the debug runs
of both algorithms log no name it lacks (a metric renamed in the step alone fails here)."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from refexp.record.metric_names import PAGE, metrics_page, unregistered
from refexp.record.metrics import read_metrics
from refexp.run import run
from tests.helpers.configs import CONF_DIR


def test_the_committed_metrics_page_is_current():
    assert PAGE.read_text(encoding="utf-8") == metrics_page(), (
        "docs/metrics.md is stale: run `python -m refexp.record.metric_names`")


@pytest.mark.parametrize("algo", ["grpo", "dpo"])
def test_debug_runs_log_only_registered_names(algo, tmp_path):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"algo={algo}", "debug=fast", f"run_dir={tmp_path}",
                                           "logger.progress=false", "training.num_threads=1"])
    run(cfg)
    names = {k for row in read_metrics(tmp_path) for k in row} - {"step"}
    assert names and unregistered(names) == []
    page = PAGE.read_text(encoding="utf-8")
    assert [n for n in sorted(names) if f"`{n}`" not in page] == []
