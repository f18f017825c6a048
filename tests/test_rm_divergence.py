"""``algo=rm`` whose training diverges (every held-out loss NaN or infinite) ends in one line that says so and
names ``rm.lr`` (``refexp/algos/rm.py``), instead of a ``TypeError`` on the best weights it never kept; nothing
is left in the cache."""

from __future__ import annotations

import pytest

from refexp.config import ConfigError
from refexp.run import run
from tests.helpers.configs import compose_small_run

RM_STAGE = ["rm.num_samples=64", "rm.samples_per_prompt=4", "rm.steps=4", "rm.batch_size=16", "rm.eval_every=2"]


@pytest.mark.slow
def test_a_diverged_reward_model_is_one_line_naming_the_learning_rate(tmp_path, monkeypatch):
    monkeypatch.setenv("REFEXP_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match=r"no held-out evaluation .* finite loss .*lower rm\.lr=1e\+08") as e:
        run(compose_small_run(tmp_path / "run", "algo=rm", *RM_STAGE, "rm.lr=1e8"))
    assert "\n" not in str(e.value)
    assert not any((tmp_path / "cache" / "rm").glob("*/rm.json"))
