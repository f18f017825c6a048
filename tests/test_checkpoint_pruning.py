"""``checkpoint.keep_latest_k`` prunes only the ``step-<N>`` dirs refexp writes: a user's file or dir in the
checkpoint folder whose name merely contains ``step-N`` stays (refexp/titan/optim_checkpoint.py)."""

from __future__ import annotations

import pytest

from refexp.run import run
from tests.helpers.configs import TINY_GRPO_OVERRIDES, compose_tiny_run


@pytest.mark.slow
def test_pruning_keeps_a_users_files_that_mention_a_step(tmp_path):
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "step-4.keep").write_text("mine")
    (folder / "notes-step-1").mkdir()
    (folder / "notes-step-1" / "README").write_text("mine too")
    run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, "training.steps=4", "checkpoint.interval=1",
                         "checkpoint.keep_latest_k=2"))
    assert sorted(p.name for p in folder.iterdir()) == ["notes-step-1", "step-3", "step-4", "step-4.keep"]
    assert (folder / "notes-step-1" / "README").read_text() == "mine too"
