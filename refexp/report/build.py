"""build_report: sweep dir -> tables, plots, sections, report.md / report.html / summary.json.

The order is spelled out: read every run, group by swept settings, summarise per algorithm (the comparison
tables every section reads), plot, compute each section (``refexp/report/sections/``, in its registry's order),
then what reads other sections' results (``Section.after``), write. Nothing here knows a metric's meaning (that
lives in ``reduce.py``) or names an analysis.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from refexp.report import sections as registry
from refexp.report.reading.archive import runs_source
from refexp.report.reading.comparison_plan import ComparisonPlan, make_plan, valid_margin
from refexp.report.reading.config_history import ConfigHistory, histories
from refexp.report.reading.group import group_runs, merged_note
from refexp.report.reading.load import Run, load_sweep
from refexp.report.reading.reduce import at_step_columns
from refexp.report.reading.setup import setup_rows
from refexp.report.sections.base import AlgorithmSection, Section, Sweep
from refexp.report.statistics.summary import AlgoTable, summarize
from refexp.report.version import rendered_by
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


@dataclass(kw_only=True)
class Report:
    """What build_report made: the tables (numbers), the runs left out, each section's result, and the files
    written. A section's result is ``report.<its name>`` (``report.frontier``; an algorithm section's is algo ->
    result: ``report.own_changes["grpo"]``)."""

    sweep_dir: Path
    runs: list[Run]
    tables: dict[str, AlgoTable]
    """algo -> its comparison table, for the algorithms with a completed run."""
    problems: list[Problem] = field(default_factory=list)
    plots: dict[str, dict[str, Path]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    setup: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    """algo -> the setup block's (label, value) rows."""
    extra_columns: tuple = ()
    """Columns asked for beyond ``reduce.COLUMNS`` (``--at-steps``: the headline metric at S, ``acc@S`` or ``gold@S``,
    and its gain after S)."""
    plan: ComparisonPlan = field(default_factory=lambda: ComparisonPlan(None, None))
    """The comparison the verdicts read (declared or exploratory) and the runs it leaves out."""
    configs: list[ConfigHistory] = field(default_factory=list)
    """The experiment files the runs were launched with, against when the first run began (``config_history``)."""
    rendered: dict = field(default_factory=dict)
    """summary.json's ``report_version`` and ``rendered_by_commit`` (``version.rendered_by``), read before the build
    writes anything: rewriting a committed report's own files must not make its checkout read as edited."""
    sections: list[Section] = field(default_factory=list)
    """What the report says, top to bottom (``sections.SECTIONS``)."""
    algorithm_sections: list[AlgorithmSection] = field(default_factory=list)
    """What it says under each algorithm (``sections.ALGORITHM_SECTIONS``)."""
    summary_keys: tuple[str, ...] = ()
    """summary.json's top-level order (``sections.SUMMARY_KEYS``)."""
    results: dict[str, Any] = field(default_factory=dict)
    """section name -> its result."""

    def result(self, name: str) -> Any:
        """The result of the section called ``name`` (None: no such section, or it had nothing to say)."""
        return self.results.get(name)

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("_") and name in self.__dict__.get("results", {}):
            return self.results[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def title(self) -> str:
        return f"Reference-strategy report: {self.sweep_dir.name}"

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
    sweep = Sweep(runs, plan, by_algo, tables, plots_dir, target, extra)
    sections, per_algo = list(registry.SECTIONS), list(registry.ALGORITHM_SECTIONS)
    results = {s.name: s.compute(sweep) for s in sections if s.name}
    for s in per_algo:  # an algorithm's result is kept where there is one
        results[s.name] = {algo: r for algo in tables if (r := s.compute(sweep, algo))}
    setup = {algo: setup_rows(by_algo[algo], plan, tuple(configs))
             + [row for s in sections for row in s.setup_rows(results.get(s.name), algo, sweep)] for algo in tables}
    report = Report(sweep_dir=sweep_dir, runs=runs, tables=tables, problems=problems, plots=plots, notes=notes,
                    setup=setup, extra_columns=extra, plan=plan, configs=configs, rendered=rendered,
                    sections=sections, algorithm_sections=per_algo, summary_keys=registry.SUMMARY_KEYS,
                    results=results)
    for s in sections:  # what reads other sections' results (the first screen's plot of the frontier's contrasts)
        if s.name and (late := s.after(report, sweep)) is not None:
            results[s.name] = late
    write_all(report)
    return report
