"""A pilot's runs as the design step reads them (``refexp-report --plan EXPERIMENT --pilot PILOT``): per run its arm,
SFT start, seed, frontier-key value (β), final matched-axis x, final metric y, the measurement variance of its x
(from its per-prompt contributions, where logged) and its trajectory (x, y at each evaluation after step 0).

PILOT is a sweep dir, a dir holding a ``runs.tar.xz`` (a committed report's, e.g. ``docs/frontier_test``), or a
``runs.tar.xz`` file itself; the archive is extracted as the report extracts it (``reading/archive.py``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from refexp.report.reading.archive import ARCHIVE, extracted, runs_source
from refexp.report.reading.load import Run, _get, natural_key
from refexp.report.statistics.metric_scores import final_scores, final_value


@dataclass(frozen=True)
class PilotRun:
    arm: str
    start: str
    seed: int
    key: float
    """The run's frontier-key value (β)."""
    x: float
    y: float
    x_var: Optional[float]
    """The variance of the run's x as a mean over its per-prompt contributions (var / n); None: not logged."""
    trajectory: tuple[tuple[int, float, float], ...] = ()
    """(step, x, y) at each evaluation after step 0 where both were logged, in step order."""


@dataclass
class PilotRuns:
    source: str
    runs: list[PilotRun]

    @property
    def starts(self) -> list[str]:
        return sorted({r.start for r in self.runs}, key=natural_key)

    def grid(self, arm: str) -> list[float]:
        """The frontier-key values the pilot ran ``arm`` at, ascending."""
        return sorted({r.key for r in self.runs if r.arm == arm})

    def of(self, arm: str) -> list[PilotRun]:
        return [r for r in self.runs if r.arm == arm]


@contextlib.contextmanager
def pilot_dir(path: Path) -> Iterator[Path]:
    """The dir holding the pilot's run dirs: ``path`` itself, its ``runs.tar.xz`` extracted, or ``path`` (an archive
    file) extracted; removed on exit where extracted."""
    path = Path(path)
    if path.is_file():
        with extracted(path) as tmp:
            yield tmp
    else:
        with runs_source(path) as src:
            yield src


def is_archive(path: Path) -> bool:
    """Whether ``path`` names runs as an archive (a ``*.tar.xz`` file, or a dir holding ``runs.tar.xz``)."""
    path = Path(path)
    return path.name.endswith(".tar.xz") or (path / ARCHIVE).is_file()


def _number(run: Run, key: str) -> Optional[float]:
    v = run.override(key)
    v = _get(run.config, key) if v is None else v
    try:
        return float(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def _trajectory(run: Run, axis: str, metric: str) -> tuple[tuple[int, float, float], ...]:
    xs, ys = (dict(zip(*run.series(k))) for k in (axis, metric))
    return tuple((int(s), xs[s], ys[s]) for s in sorted(set(xs) & set(ys)) if s > 0)


def read_runs(raw: list[Run], source: str, block: dict, axis: str, metric: str) -> PilotRuns:
    """The completed runs of ``raw`` in ``block``'s arms (its ``arm_key``) with a final ``axis`` and ``metric`` and a
    value of its ``frontier_key``; seeds outside ``block['seeds']`` count too (a pilot may run other seeds)."""
    arm_key, key = block["arm_key"], block.get("frontier_key")
    out = []
    for r in raw:
        arm = r.override(arm_key) or _get(r.config, arm_key)
        if r.problem is not None or r.seed is None or arm not in block["arms"]:
            continue
        x, y = final_value(r, axis), final_value(r, metric)
        v = _number(r, key) if key else 0.0
        if x is None or y is None or v is None:
            continue
        contributions = final_scores(r, axis)
        x_var = None
        if contributions and len(contributions) > 1:
            c = np.fromiter(contributions.values(), dtype=float)
            x_var = float(c.var(ddof=1) / len(c))
        out.append(PilotRun(str(arm), r.sft_start, int(r.seed), v, float(x), float(y), x_var,
                            _trajectory(r, axis, metric)))
    return PilotRuns(source, out)

