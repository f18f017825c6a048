"""``task.reward_weights`` are finite numbers: a NaN or infinite weight is refused in one line naming the field
(``refexp/config/task.py``), before anything is built."""

from __future__ import annotations

import pytest

from refexp.config import ConfigError, to_object
from tests.helpers.configs import compose_root


@pytest.mark.parametrize("weight", ["nan", "inf", "-inf"])
def test_a_non_finite_reward_weight_is_refused_naming_the_field(weight):
    cfg = compose_root("algo=grpo", "task.reward_funcs=[verifier]", f"task.reward_weights=[{weight}]")
    with pytest.raises(ConfigError, match=r"task\.reward_weights\[\]=.* is invalid: expected a finite number"):
        to_object(cfg)


def test_a_finite_weight_passes():
    to_object(compose_root("algo=grpo", "task.reward_funcs=[verifier]", "task.reward_weights=[0.5]"))
