"""A worker for launcher tests: spawned processes import it by name, so it lives in a module."""

from __future__ import annotations

import os


def rank_of(dcfg) -> dict:
    """Each worker's result: its rank (``spawn_workers`` returns rank 0's)."""
    return {"rank": int(os.environ["RANK"])}
