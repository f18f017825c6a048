"""KL-coefficient controllers: a fixed beta, or one adapted to hold the logged KL at a target.

The KL they read is ``kl/ref``, estimated by ``refexp/losses/kl.py`` (its module docstring says which KL that is).
"""

from __future__ import annotations

import math
from typing import Any

import torch


def _as_float(x: Any, name: str) -> float:
    value = float(x.detach().item()) if isinstance(x, torch.Tensor) else float(x)
    if not math.isfinite(value):
        raise ValueError(f"{name}={value!r} is invalid: expected a finite number")
    return value


class FixedKLController:
    """A constant KL coefficient, with the interface of ``AdaptiveKLController``."""

    def __init__(self, beta: float) -> None:
        if beta < 0:
            raise ValueError(f"beta={beta!r} is invalid: expected a number >= 0")
        self.beta = float(beta)

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> float:
        """Does nothing; returns the (unchanged) coefficient."""
        return self.beta

    def state_dict(self) -> dict[str, float]:
        return {"beta": self.beta}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.beta = float(state["beta"])


class AdaptiveKLController:
    """Proportional controller of the KL coefficient (Ziegler et al. 2019, arXiv:1909.08593).

    After a batch whose KL was ``current_kl``::

        e = clip(current_kl / target - 1, -0.2, 0.2)
        beta <- beta * (1 + e * n_steps / horizon)

    so beta grows while the KL is above ``target`` and shrinks while it is below, by at most 20% of
    ``n_steps / horizon`` per update. Same rule and constants as TRL's ``AdaptiveKLController``:
    ``n_steps`` counts samples (the rows of the global batch the KL was measured on), so with the
    default horizon of 10,000 samples beta can move by up to 20% per 10,000 samples. ``current_kl``
    should be the logged KL (``kl/ref``, see the module docstring).
    """

    def __init__(self, init_beta: float, target: float, horizon: float) -> None:
        if init_beta < 0:
            raise ValueError(f"init_beta={init_beta!r} is invalid: expected a number >= 0")
        if not target > 0:
            raise ValueError(f"target={target!r} is invalid: expected a number > 0")
        if not horizon > 0:
            raise ValueError(f"horizon={horizon!r} is invalid: expected a number > 0")
        self.beta = float(init_beta)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> float:
        """Move beta towards the value that holds the KL at ``target``; returns the new beta.

        Raises ValueError on a non-finite ``current_kl`` (one NaN would poison beta for good).
        """
        kl = _as_float(current_kl, "current_kl")
        proportional_error = min(max(kl / self.target - 1.0, -0.2), 0.2)
        self.beta *= 1.0 + proportional_error * n_steps / self.horizon
        return self.beta

    def state_dict(self) -> dict[str, float]:
        """Only beta is state; target and horizon come from the config on resume."""
        return {"beta": self.beta}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.beta = float(state["beta"])
