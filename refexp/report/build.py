"""build_report: sweep dir -> tables, plots, report.md / report.html / summary.json.

The order is spelled out: read every run, group by swept settings, summarise per algorithm,
plot, write. Nothing here knows a metric's meaning; that lives in ``reduce.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional, Sequence

from refexp.report.reading.archive import runs_source
from refexp.report.reading.config_history import ConfigHistory, histories
from refexp.report.reading.group import Group, group_runs, merged_note
from refexp.report.reading.load import Run, load_sweep, sft_start_keys
from refexp.report.reading.plan import ComparisonPlan, make_plan, valid_margin
from refexp.report.reading.reduce import at_step_columns
from refexp.report.reading.setup import setup_rows
from refexp.report.statistics import gold_peak, own_change
from refexp.report.statistics import selection
from refexp.report.statistics.summary import AlgoTable, summarize
from refexp.report.version import rendered_by
from refexp.report.writing import frontier_report, gao_section
from refexp.report.writing.plots import make_plots
from refexp.report.writing.render import write_all

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
    """Columns asked for beyond ``reduce.COLUMNS`` (``--at-steps``: the headline metric at S, ``acc@S`` or ``gold@S``,
    and its gain after S)."""
    plan: ComparisonPlan = field(default_factory=lambda: ComparisonPlan(None, None))
    """The comparison the verdicts read (declared or exploratory) and the runs it leaves out."""
    frontier: Optional[frontier_report.FrontierReport] = None
    """The frontier across ``comparison.frontier_key`` and the tuned comparison (``comparison.select``)."""
    kept: dict[str, own_change.OwnChanges] = field(default_factory=dict)
    """algo -> each group's change of ``eval/retention`` from its runs' starts (groups that measured it)."""
    within: dict[str, dict[str, AlgoTable]] = field(default_factory=dict)
    """algo -> SFT start -> the table and verdicts of that start's runs alone (with several starts only)."""
    configs: list[ConfigHistory] = field(default_factory=list)
    """The experiment files the runs were launched with, against when the first run began (``config_history``)."""
    gao: Optional[gao_section.GaoSection] = None
    """Gao et al.'s RL form fitted per reference strategy, when runs log ``eval/gold`` (``statistics/gao.py``)."""
    peaks: dict[str, gold_peak.GoldPeaks] = field(default_factory=dict)
    """algo -> each group's test gold at the step validation chose, and each arm at its gold peak
    (``statistics/gold_peak.py``), where runs log test and validation gold."""
    rendered: dict = field(default_factory=dict)
    """summary.json's ``report_version`` and ``rendered_by_commit`` (``version.rendered_by``), read before the build
    writes anything: rewriting a committed report's own files must not make its checkout read as edited."""

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


def _within_starts(algo: str, groups: list[Group], target: Optional[float], plan: ComparisonPlan,
                   extra: tuple) -> dict[str, AlgoTable]:
    """SFT start -> the table of its runs alone, when the counted runs come from several starts: conditional on
    a start, its seeds then prompts are the units of the verdict, where the main table's unit is the start."""
    starts = sft_start_keys(r for g in groups for r in g.completed if plan.counts(r))
    if len(starts) < 2:
        return {}
    return {s: summarize(algo, [replace(g, runs=[r for r in g.runs if r.sft_start == s]) for g in groups], target,
                         plan, extra, conditional=True) for s in starts}


def _clear_old_plots(plots_dir: Path) -> None:
    """Drop the PNGs of a previous report, so a group or algorithm that is gone leaves no stale plot."""
    if plots_dir.is_dir():
        for p in plots_dir.glob("*.png"):
            p.unlink()


def build_report(sweep_dir, *, target: Optional[float] = None, baseline: Optional[str] = None,
                 at_steps: Sequence[int] = (), alpha: float = 0.05, margin: Optional[float] = None,
                 allow_mixed: bool = False, comparison: Optional[dict] = None,
                 repo: Optional[Path] = None) -> Report:
    """Read a Hydra multirun dir (or one run dir) and write report.md, report.html, summary.json and
    the plots into it. ``target`` is the held-out accuracy for "steps to target" (None: a default
    per algorithm, see ``summary.default_target``); the verdicts pair every group with the baseline the
    sweep's comparison block declares (``comparison``, else the runs' ``resolved_config.yaml``), or with
    ``baseline`` (a group label or a swept variant), else ``plan.default_baseline``'s (the report is then
    exploratory), decided by Holm's step-down at
    ``alpha`` over the family, with a claim of equivalence only within ``margin`` (None: the declared block's
    ``equivalence_margin``, if any); ``allow_mixed`` counts
    the runs outside the plan (``plan.make_plan``). ``at_steps`` (default: the block's) adds, per step S,
    the headline metric (``comparison.metric``, else accuracy) at S, the gain after it and a verdict at S.
    A ``margin`` that is no finite number > 0 raises ValueError first. ``repo``: the refexp checkout whose
    ``conf/experiment/`` the runs' experiment file is read from, with its git history (None: the one this package
    lives in; ``config_history``).
    A dir without run dirs but with a ``runs.tar.xz`` (a committed report's runs, ``reading/archive.py``) is read
    from that archive. Safe to call again on the same dir at any time. Raises ``NoRunsError`` (no run) before
    writing anything."""
    sweep_dir = Path(sweep_dir).resolve()
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"sweep dir {sweep_dir} does not exist")
    if margin is not None and not valid_margin(margin):
        raise ValueError(f"margin={margin!r} is invalid: expected a finite number > 0 (the equivalence margin)")
    with runs_source(sweep_dir) as source:  # a committed report's runs.tar.xz, extracted for the build's duration
        return _build(sweep_dir, load_sweep(source), target=target, baseline=baseline, at_steps=at_steps,
                      alpha=alpha, margin=margin, allow_mixed=allow_mixed, comparison=comparison, repo=repo)


def _build(sweep_dir: Path, runs: list, *, target, baseline, at_steps, alpha, margin, allow_mixed, comparison,
           repo) -> Report:
    """``build_report``'s work over the loaded ``runs``; the report's files go to ``sweep_dir``."""
    if not runs:
        raise NoRunsError(f"no runs found under {sweep_dir} (a run dir has .hydra/, status.json or "
                          f"metrics.jsonl); nothing was written")
    rendered = rendered_by()  # before the first file is written (Report.rendered)
    plan = make_plan(runs, baseline=baseline, block=comparison, alpha=alpha, margin=margin, allow_mixed=allow_mixed)
    by_algo = group_runs(runs)

    extra = at_step_columns(tuple(int(s) for s in (at_steps or plan.at_steps)), plan.metric)
    tables = {algo: summarize(algo, groups, target, plan, extra) for algo, groups in by_algo.items()}
    # An algorithm with no completed run has no numbers; its runs still appear under problems.
    tables = {a: t for a, t in tables.items() if any(row.n_completed for row in t.rows)}

    problems, notes = [], []
    for groups in by_algo.values():
        for g in groups:
            if note := merged_note(g):
                notes.append(note)
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

    configs = histories(runs, repo)
    setup = {algo: setup_rows(by_algo[algo], plan, tuple(configs)) for algo in tables}
    frontier = frontier_report.make(runs, plan, plots_dir)
    if frontier is not None and frontier.selection is not None:
        for algo, groups in by_algo.items():  # the chosen settings go to the setup block of the arms' algorithm
            if algo in setup and any(plan.arm(r) is not None for g in groups for r in g.runs):
                setup[algo] += selection.setup_rows(frontier.selection)
    kept = {algo: oc for algo in tables
            if (oc := own_change.own_changes(by_algo[algo], plan.counts, alpha=plan.alpha, margin=plan.margin))}
    within = {algo: _within_starts(algo, by_algo[algo], target, plan, extra) for algo in tables}
    report = Report(sweep_dir, runs, tables, problems, plots, notes, setup, extra, plan, frontier, kept,
                    {algo: w for algo, w in within.items() if w}, configs, gao_section.make(runs, plan, plots_dir),
                    {algo: p for algo in tables if (p := gold_peak.gold_peaks(by_algo[algo], plan.counts, plan))},
                    rendered)
    write_all(report)
    return report
