"""The whole plan of ``refexp-report --plan EXPERIMENT --pilot PILOT``: which pilots a design accepts, the power
plan's text (``plan.py``) and, for a matched design, the design step's simulation (``matched_text.py``).

A pilot with one SFT start cannot say how far the starts scatter: a design whose unit is the start (two or more)
is refused; a one-start design's plan says on its first line that the start variance is taken as 0. A matched
design (``comparison.matched.at``) needs the pilot's per-run curves (a sweep dir, a dir holding runs.tar.xz, or a
runs.tar.xz file): a summary.json holds no run's drift.
"""

from __future__ import annotations

from pathlib import Path

from refexp.report.power.experiment import Experiment
from refexp.report.power.grids import TARGET
from refexp.report.power.matched_text import POWER
from refexp.report.power.pilot import Pilot, PilotError, from_runs, read_pilot
from refexp.report.power.pilot_runs import is_archive, pilot_dir, read_runs
from refexp.report.power.plan import plan_text
from refexp.report.reading.load import find_run_dirs, load_sweep

ONE_START = "one SFT start"
"""The note ``pilot.py`` writes for a pilot with one SFT start."""
SWEEPS = 1000


def _one_start(pilot: Pilot) -> bool:
    return any(n.startswith(ONE_START) for n in pilot.notes)


def _starts_check(exp: Experiment, pilot: Pilot, path: Path) -> str:
    """The plan's first line for a one-start pilot of a one-start design ("" otherwise); ``PilotError`` for a one-start
    pilot of a design whose unit is the start."""
    if not _one_start(pilot):
        return ""
    if exp.starts >= 2:
        raise PilotError(f"--pilot {path} has one SFT start, but {exp.path.name} runs {exp.starts} (hydra.sweeper."
                         f"params sft.seed) and tests over them: its plan needs the starts' variance, from a pilot of "
                         f"2 or more SFT starts on the same model")
    return ("Start variance taken as 0: the pilot has one SFT start, as the design has (its t is over the seeds); "
            "what another start would give is not measured.\n\n")


def _is_summary(path: Path) -> bool:
    return path.is_file() and not is_archive(path) or (path.is_dir() and not is_archive(path)
                                                        and not find_run_dirs(path)
                                                        and (path / "summary.json").is_file())


def _from_fits(exp, runs, fits, source: str, metric: str) -> Pilot:
    """A ``Pilot`` whose components are the fitted metric's spread (``matched_text.components_of``)."""
    from refexp.report.power.matched_text import components_of

    notes = [f"the pilot's report pairs no arm with {exp.block['baseline']} (one group per β): the components are "
             f"the spread of each arm's {metric} about its fitted curve against drift (start; seed and run), of the "
             f"baseline plus a primary arm; the prompts' share is inside the seeds' row"]
    if len(runs.starts) < 2:
        notes.append(f"{ONE_START}: the starts' variance is not estimable, taken as 0")
    return Pilot(source, components_of(fits, exp.block["baseline"]), [f"{a} - {exp.block['baseline']}"
                                                                        for a in exp.primary], None, notes, metric)


def full_plan(exp: Experiment, path: Path, metric: str, alpha: float = 0.05, sweeps: int = SWEEPS) -> str:
    """The plan's text (module doc); ``PilotError`` (one line) for a pilot the design cannot use."""
    path = Path(path)
    matched = bool(exp.matched_at[1]) and bool(exp.block.get("frontier_key"))
    if _is_summary(path):
        if matched:
            raise PilotError(f"--pilot {path} is a summary.json: a matched design (comparison.matched.at) needs the "
                             f"pilot's per-run curves: a sweep dir, a dir holding runs.tar.xz, or a runs.tar.xz file")
        pilot = read_pilot(path, metric)
        return _starts_check(exp, pilot, path) + plan_text(exp, pilot, alpha)
    with pilot_dir(path) as d:  # everything read inside: an extracted archive is removed on exit
        raw = load_sweep(d)
        if not matched:
            pilot = from_runs(raw, str(path), metric)
            pilot.metric = metric
            return _starts_check(exp, pilot, path) + plan_text(exp, pilot, alpha)
        from refexp.report.power.matched_text import fit_arms, matched_design_text

        runs = read_runs(raw, str(path), exp.block, exp.matched_at[0], metric)
        try:
            pilot = from_runs(raw, str(path), metric)
        except PilotError:  # a frontier pilot: its baseline has one group per β, no group pairs with it
            pilot = _from_fits(exp, runs, fit_arms(exp, runs), str(path), metric)
        pilot.metric = metric
        first = _starts_check(exp, pilot, path)
        text = answer_first(plan_text(exp, pilot, alpha), matched_design_text(exp, pilot, runs, alpha, sweeps))
    return first + text


def answer_first(plan: str, simulated: str) -> str:
    """The plan with the simulation's verdict lifted above its design: the declared estimand's warnings (P(no
    claim) > 0.2, power < 0.8), else the line that it can answer, so that the first screen says whether to run."""
    warnings = [line for line in simulated.splitlines() if line.startswith("- warning: ")]
    answer = (["**The design cannot answer as declared** (simulated below, \"Can the matched design answer?\"):", ""]
              + warnings if warnings else
              [f"**The design can answer as declared**: for every primary contrast the simulated P(no claim) is at "
               f"most {TARGET:g} and the power at the margin at least {POWER:g} (below, \"Can the matched design "
               f"answer?\")."])
    head, sep, rest = plan.partition("\n\n## Design")
    return head + "\n\n" + "\n".join(answer) + sep + rest + simulated
