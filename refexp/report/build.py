"""build_report: sweep dir -> tables, plots, report.md / report.html / summary.json.

The order is spelled out: read every run, group by swept settings, summarise per algorithm,
plot, write. Nothing here knows a metric's meaning; that lives in ``reduce.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from .group import group_runs
from .load import Run, load_sweep
from .plots import make_plots
from .reduce import at_step_columns
from .render import write_all
from .setup import setup_rows
from .table import AlgoTable, summarize

PLOTS_DIR = "report_plots"
"""Sub-directory of the sweep dir that holds the PNGs (the report owns it and rewrites it)."""


class NoRunsError(FileNotFoundError):
    """The directory holds no run: nothing is written (an existing report stays as it was)."""


@dataclass
class Problem:
    """A run left out of the numbers, and why."""

    name: str
    algo: str
    strategy: str
    label: str
    state: str
    error: str


@dataclass
class Report:
    """What build_report made: the tables (numbers), the runs left out, and the files written."""

    sweep_dir: Path
    runs: list[Run]
    tables: dict[str, AlgoTable]
    problems: list[Problem]
    plots: dict[str, dict[str, Path]]
    notes: list[str] = field(default_factory=list)
    setup: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    """algo -> the setup block's (label, value) rows."""
    extra_columns: tuple = ()
    """Columns asked for beyond ``reduce.COLUMNS`` (``--at-steps``: ``acc@S``, ``gain after S``)."""

    @property
    def shown_dir(self) -> str:
        """The sweep dir as a report shows it: relative to the working directory (a repo-relative path when
        run from the checkout), else its name alone; never an absolute path of this machine."""
        try:
            return self.sweep_dir.relative_to(Path.cwd().resolve()).as_posix()
        except ValueError:
            return self.sweep_dir.name

    @property
    def markdown_path(self) -> Path:
        return self.sweep_dir / "report.md"

    @property
    def html_path(self) -> Path:
        return self.sweep_dir / "report.html"

    @property
    def summary_path(self) -> Path:
        return self.sweep_dir / "summary.json"


def _clear_old_plots(plots_dir: Path) -> None:
    """Drop the PNGs of a previous report, so a group or algorithm that is gone leaves no stale plot."""
    if plots_dir.is_dir():
        for p in plots_dir.glob("*.png"):
            p.unlink()


def build_report(sweep_dir, *, target: Optional[float] = None, baseline: str = "fixed",
                 at_steps: Sequence[int] = ()) -> Report:
    """Read a Hydra multirun dir (or one run dir) and write report.md, report.html, summary.json and
    the plots into it. ``target`` is the held-out accuracy for "steps to target" (None: a default
    per algorithm, see ``table.default_target``); ``baseline`` the strategy (or group label) every
    group is paired against by seed; ``at_steps`` adds, per step S, the accuracy at S and the gain after
    it (``reduce.at_step_columns``). Safe to call again on the same dir at any time. Raises
    ``NoRunsError`` before writing anything when the dir holds no run."""
    sweep_dir = Path(sweep_dir).resolve()
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"sweep dir {sweep_dir} does not exist")
    runs = load_sweep(sweep_dir)
    if not runs:
        raise NoRunsError(f"no runs found under {sweep_dir} (a run dir has .hydra/, status.json or "
                          f"metrics.jsonl); nothing was written")
    by_algo = group_runs(runs)

    extra = at_step_columns(tuple(int(s) for s in at_steps))
    tables = {algo: summarize(algo, groups, target, baseline, extra) for algo, groups in by_algo.items()}
    # An algorithm with no completed run has no numbers; its runs still appear under problems.
    tables = {a: t for a, t in tables.items() if any(row.n_completed for row in t.rows)}

    problems, notes = [], []
    for groups in by_algo.values():
        for g in groups:
            for r in g.runs:
                if r.problem is not None:
                    problems.append(Problem(r.name, g.algo, g.strategy, g.label, r.state, r.problem))
                if r.bad_lines:
                    notes.append(f"run {r.name}: {r.bad_lines} unreadable line(s) in metrics.jsonl skipped")
    order = {r.name: i for i, r in enumerate(runs)}
    problems.sort(key=lambda p: order[p.name])

    plots_dir = sweep_dir / PLOTS_DIR
    _clear_old_plots(plots_dir)
    plots = {algo: make_plots(algo, by_algo[algo], plots_dir) for algo in tables}

    setup = {algo: setup_rows(by_algo[algo]) for algo in tables}
    report = Report(sweep_dir, runs, tables, problems, plots, notes, setup, extra)
    write_all(report)
    return report
