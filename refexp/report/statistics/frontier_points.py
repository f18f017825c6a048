"""The points a frontier is drawn through: an arm's runs as (frontier value, final x, final accuracy), the axis x
is read on, and the curves they form; shared by ``frontier.py`` and ``frontier_key.py`` (a curve read along its key).
"""

from __future__ import annotations

from dataclasses import dataclass

from refexp.record.metric_names import EVAL_RETENTION, KL_INIT
from refexp.report.reading.load import Run
from refexp.report.statistics.paired import Unit


@dataclass(frozen=True)
class Axis:
    """What accuracy is matched on: a final metric per run, interpolated in log space (drift) or linearly."""

    key: str
    log: bool


DRIFT_AXIS = Axis(KL_INIT, True)
RETENTION_AXIS = Axis(EVAL_RETENTION, False)
"""The second axis when runs log it: the skill RL does not train, measured on held-out prompts."""


@dataclass(frozen=True)
class Point:
    """One run on its arm's curve: its frontier value, its final x and its final accuracy."""

    run: Run
    value: float
    x: float
    y: float


Curves = dict[str, dict[Unit, list[Point]]]
"""curve label (the arm, and its other swept settings when it has any) -> (SFT start, seed) -> its points, sorted
by x."""
