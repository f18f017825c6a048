"""The design step's section of a matched design's plan: the fitted model, P(no claim) with the pilot's own bound,
power at the margin and the detectable difference per primary contrast under both estimands, and β grids under which
the design can answer (``fit.py``, ``simulate.py``, ``crossing.py``, ``grids.py``, ``pilot_failures.py``)."""

from __future__ import annotations

import math

import numpy as np

from refexp.report.power.crossing import REASONS as CROSSING_REASONS
from refexp.report.power.crossing import crossing_reader, growth_exponent
from refexp.report.power.detectable import Components, detectable_difference
from refexp.report.power.experiment import Experiment
from refexp.report.power.fit import ArmFit, fit_arm
from refexp.report.power.grids import TARGET, choose_grid
from refexp.report.power.pilot import Pilot, PilotError
from refexp.report.power.pilot_contrasts import paired_section
from refexp.report.power.pilot_failures import carried, pilot_failures
from refexp.report.power.pilot_runs import PilotRuns
from refexp.report.power.simulate import ContrastSim, Rules, SimDesign, frontier_reader, simulate
from refexp.report.reading.comparison_plan import MATCHED_ESTIMANDS
from refexp.report.statistics.frontier import frontier_gap
from refexp.report.statistics.reading_rules import REASONS

POWER = 0.8
ESTIMANDS = MATCHED_ESTIMANDS
"""``comparison.matched.estimand``'s values: both are simulated on a drift axis, the frontier alone on a linear one."""


def rules_of(exp: Experiment) -> Rules:
    """The report's reading rule as the experiment declares it."""
    axis = exp.matched_at[0]
    matched = exp.block.get("matched") or {}
    max_gap = matched.get("max_gap")

    class _Plan:  # frontier_gap reads a plan's block
        block = exp.block

    return Rules(axis.startswith("kl/"), frontier_gap(_Plan()), float(max_gap) if max_gap is not None else None,
                 str(matched.get("along") or "axis"))


def _schedule(exp: Experiment, runs: PilotRuns) -> tuple[int, int, str]:
    """(steps, eval.every, where from): the experiment file's, else the pilot's runs'."""
    steps = (exp.doc.get("training") or {}).get("steps")
    every = (exp.doc.get("eval") or {}).get("every")
    if isinstance(steps, int) and isinstance(every, int):
        return steps, every, "the experiment file's training.steps and eval.every"
    traj = [r.trajectory for r in runs.runs if r.trajectory]
    last = max(t[-1][0] for t in traj) if traj else 1
    first = min(t[0][0] for t in traj) if traj else last
    return (steps if isinstance(steps, int) else last), (every if isinstance(every, int) else first), \
        "the pilot's evaluation steps (the experiment file does not set training.steps and eval.every)"


def _p(x: float) -> str:
    return f"{x:.2f}"


def _reasons(c: ContrastSim, names: dict[str, str]) -> str:
    if not c.reasons:
        return "none"
    order = list(names)  # ties in the order reasons are listed: a Counter fed from sets would order them by hash
    ranked = sorted(c.reasons.items(), key=lambda kv: (-kv[1], order.index(kv[0]) if kv[0] in order else len(order)))
    return "; ".join(f"{names.get(k, k)} {v / c.sweeps:.2f}" for k, v in ranked)


def _fit_table(fits: dict[str, ArmFit], axis: str) -> list[str]:
    scale = f"log {axis}" if next(iter(fits.values())).log else axis
    lines = [f"| arm | pilot β | mean {scale} per β (monotone fit) | run sd per β (of it, measurement) | start sd | "
             f"seed sd | metric cubic in {scale} (highest power first) | metric sd: start, seed, run |",
             "|:---|:---|:---|:---|---:|---:|:---|:---|"]
    for f in fits.values():
        keys = ", ".join(f"{math.exp(k):g}" for k in f.log_keys)
        means = ", ".join(f"{m:.2f}" + ("" if abs(m - r) < 5e-3 else f" ({r:.2f})") for m, r in zip(f.mean_t, f.raw_t))
        sds = ", ".join(f"{math.sqrt(v):.2f} ({math.sqrt(m):.2f})" for v, m in zip(f.run_var, f.meas_var))
        coef = ", ".join(f"{c:.3g}" for c in f.coef)
        lines.append(f"| {f.arm} | {keys} | {means} | {sds} | {math.sqrt(f.start_var):.2f} | "
                     f"{math.sqrt(f.seed_var):.2f} | {coef} | {math.sqrt(f.y_start_var):.3f}, "
                     f"{math.sqrt(f.y_seed_var):.3f}, {math.sqrt(f.y_run_var):.3f} |")
    return lines


def fit_arms(exp: Experiment, runs: PilotRuns) -> dict[str, ArmFit]:
    """``fit_arm`` of the baseline and each primary arm; ``PilotError`` for an arm the pilot ran at fewer than 2
    values of the frontier key or fewer than 4 runs."""
    fits: dict[str, ArmFit] = {}
    key = exp.block["frontier_key"]
    for arm in [exp.block["baseline"], *exp.primary]:
        mine = runs.of(arm)
        if len({r.key for r in mine}) < 2 or len(mine) < 4:
            raise PilotError(f"--pilot {runs.source}: arm {arm} has {len(mine)} completed runs at "
                             f"{len({r.key for r in mine})} values of {key}: the design step fits its drift against "
                             f"{key} from 2 or more values, 4 or more runs")
        fits[arm] = fit_arm(arm, mine, rules_of(exp).log)
    return fits


def components_of(fits: dict[str, ArmFit], baseline: str) -> Components:
    """Components of one arm - baseline difference from the fitted metric's spread (the baseline's plus the mean of
    the other arms'): for a pilot whose report pairs no arm with the baseline (its baseline has one group per β);
    the run spread stands in the seeds' row (the residual is inside it), the prompts' in both."""
    others = [f for a, f in fits.items() if a != baseline] or [fits[baseline]]
    b = fits[baseline]
    mean = lambda name: float(np.mean([getattr(f, name) for f in others]))  # noqa: E731
    return Components(b.y_start_var + mean("y_start_var"), b.y_seed_var + b.y_run_var + mean("y_seed_var")
                      + mean("y_run_var"), 0.0, None)


def matched_design_text(exp: Experiment, pilot: Pilot, runs: PilotRuns, alpha: float, sweeps: int,
                        grid_search: bool = True) -> str:
    """The section (module doc), markdown."""
    axis, values = exp.matched_at
    base, primary = exp.block["baseline"], exp.primary
    rules = rules_of(exp)
    declared = str((exp.block.get("matched") or {}).get("estimand") or ESTIMANDS[0])
    fits = fit_arms(exp, runs)
    declared_grids = (exp.block.get("matched") or {}).get("grids") or {}
    grids = {a: sorted(float(b) for b in declared_grids[a]) if a in declared_grids else runs.grid(a) for a in fits}
    prompts = exp.prompts or pilot.prompts or 0
    design = SimDesign(exp.starts, exp.seeds, grids, base, primary, list(values), rules, alpha, exp.family, exp.margin,
                       pilot.components.prompt / prompts if prompts else 0.0)
    steps, every, schedule_from = _schedule(exp, runs)
    exponent = growth_exponent(runs, rules.log)
    estimands = ESTIMANDS if rules.log else ESTIMANDS[:1]  # the crossing reads a drift
    readers = {"frontier": frontier_reader(rules)}
    if rules.log:
        readers["crossing"] = crossing_reader(fits, steps, every, 1.0 if exponent is None else exponent, rules.log)
    results = {e: simulate(fits, design, sweeps, seed=0, reader=readers[e]) for e in estimands}
    replicates = exp.starts * exp.seeds
    df = exp.starts - 1 if exp.starts >= 2 else exp.seeds - 1
    lines = ["", "## Can the matched design answer? (simulated from the pilot's runs)", "",
             f"Each arm's drift against {exp.block['frontier_key']} and its {pilot.metric} against drift, fitted to "
             f"the pilot's {len(runs.runs)} runs over {len(runs.starts)} SFT start{'s' * (len(runs.starts) != 1)} "
             f"(`refexp/report/power/fit.py`; why these curves: `docs/runs.md`, \"Power plan\"):", ""]
    lines += _fit_table(fits, axis)
    grid_text = "; ".join(f"{a} {', '.join(f'{b:g}' for b in g)}" for a, g in grids.items())
    lines += ["", f"{sweeps} sweeps of the design were simulated ({exp.starts} SFT starts × {exp.seeds} seeds = "
              f"{replicates} replicates; {_grid_source(fits, declared_grids)}: {grid_text}; {design.runs} runs of "
              f"these arms), each read as the report reads it (`statistics/reading_rules.py`: comparison.frontier_gap "
              f"{rules.key_gap:g}, "
              f"comparison.matched.max_gap {'none' if rules.max_gap is None else f'{rules.max_gap:g}'}, along "
              f"{rules.along}), the difference's t over the {'SFT starts' if exp.starts >= 2 else 'seeds'}, Holm over "
              f"the family of {exp.family}. The experiment declares the **{declared}** estimand "
              + (f"(comparison.matched.estimand); both are shown. The crossing reads each run where its drift first "
                 f"passes the value between two evaluations after step 0 (every {every} of {steps} steps: "
                 f"{schedule_from}; drift growing as step^{1.0 if exponent is None else exponent:.2f}, "
                 + ("assumed: the pilot evaluated at its end only" if exponent is None else "the pilot's") + ")."
                 if rules.log else f"(comparison.matched.estimand); the crossing estimand reads a drift, not {axis}."),
              "",
              "| contrast | estimand | P(no claim) | why (share of sweeps) | the pilot's own replicates | power at "
              "the margin | se | detectable (80%) | fitted difference |",
              "|:---|:---|---:|:---|:---|---:|---:|---:|---:|"]
    paired, paired_powers = paired_section(runs, base, primary, list(values), rules, axis, exp.starts, exp.seeds,
                                           exp.margin, alpha / exp.family)
    warnings = []
    for e in estimands:
        for c in results[e]:
            label = f"{c.arm} - {base} at {axis} {c.at:.3g}"
            mark = f"**{e}** (declared)" if e == declared else e
            own = "-"
            if e == "frontier":
                pf = pilot_failures(runs, base, c.arm, c.at, rules)
                own = (f"{pf.failed} of {pf.replicates} fail; per replicate ≤ {pf.upper():.2f} (95%), so P(no claim) "
                       f"≤ {carried(pf.upper(), replicates):.2f} at {replicates}")
            mdd = detectable_difference(c.se, df, alpha / exp.family, POWER) if c.se == c.se else math.inf
            names = {**REASONS, **CROSSING_REASONS}
            lines.append(f"| {label} | {mark} | {_p(c.p_no_claim)} | {_reasons(c, names)} | {own} | "
                         f"{_p(c.power) if exp.margin is not None else '-'} | "
                         f"{'-' if c.se != c.se else f'{c.se:.3f}'} | "
                         f"{'-' if math.isinf(mdd) else f'±{mdd:.3f}'} | {c.truth:+.3f} |")
            if e == declared:
                if c.p_no_claim > TARGET:
                    warnings.append(f"warning: {label} ({e}): P(no claim) {_p(c.p_no_claim)} > {TARGET:g}")
                bound = paired_powers.get((c.arm, c.at)) if e == "frontier" else None
                power, whose = (c.power, "simulated") if bound is None else (bound, "the pilot's paired bound")
                if exp.margin is not None and power < POWER:
                    warnings.append(f"warning: {label} ({e}): power at the margin ±{exp.margin:g} "
                                    f"{_p(power)} < {POWER:g} ({whose})")
    lines += ["", "P(no claim): the share of simulated sweeps in which some replicate of either arm cannot be read "
              "(by reason: the share of sweeps with a replicate failing for it). The pilot's own replicates: those "
              "failing the same rule on the pilot's grids, the Clopper-Pearson bound of their rate carried to the "
              "design's replicates (a small pilot bounds it loosely). Power: the share of sweeps whose Holm-adjusted t "
              "rejects when the arm's true difference is the margin; detectable: the difference found with 80% power "
              "at the simulated se (`detectable.py`)."]
    lines += paired
    if warnings:
        lines += [""] + [f"- {w}" for w in warnings]
    if grid_search:
        lines += _grid_lines(exp, fits, design, readers[declared], sweeps, declared, base)
    return "\n".join(lines) + "\n"


def _grid_source(fits: dict, declared: dict) -> str:
    """Where the simulated β grids come from: the experiment's comparison.matched.grids, the pilot's, or both."""
    named = [a for a in fits if a in declared]
    if len(named) == len(fits):
        return "the β grids are the experiment's (comparison.matched.grids)"
    if not named:
        return "the β grids are the pilot's own"
    return f"the β grids are the experiment's for {', '.join(named)} (comparison.matched.grids), else the pilot's"


def _grid_lines(exp: Experiment, fits: dict[str, ArmFit], design: SimDesign, reader, sweeps: int, declared: str,
                base: str) -> list[str]:
    axis = exp.matched_at[0]
    chosen = {a: choose_grid(f, exp.starts, exp.seeds, design.at, design.rules.key_gap, reader)
              for a, f in fits.items()}
    lines = ["", f"## β grids under which the design can answer ({declared})", "",
             f"Per arm, the cheapest geometric grid around the β where its fitted drift reaches {axis} "
             f"{', '.join(f'{x:.3g}' for x in design.at)} whose simulated replicates fail so rarely that each "
             f"contrast's P(no claim) is ≤ {TARGET:g} (`refexp/report/power/grids.py`):", "",
             "| arm | β at the value | grid | P(some replicate fails) | runs |", "|:---|---:|:---|---:|---:|"]
    for a, g in chosen.items():
        grid = ("none found" if g.grid is None else ", ".join(f"{b:g}" for b in g.grid)
                + (" (past the pilot's β: extrapolated)" if g.beyond else ""))
        runs = "-" if g.grid is None else str(len(g.grid) * exp.starts * exp.seeds)
        key = "never" if g.key_at is None else f"{g.key_at:.3g}"
        lines.append(f"| {a} | {key} | {grid} | {g.q:.2f} | {runs} |")
    if all(g.grid is not None for g in chosen.values()):
        d = SimDesign(**{**design.__dict__, "grids": {a: g.grid for a, g in chosen.items()}})
        check = simulate(fits, d, sweeps, seed=1, reader=reader)
        lines += ["", f"Under these grids ({d.runs} runs) the simulated P(no claim) is "
                  + ", ".join(f"{c.arm} - {base} {_p(c.p_no_claim)}" for c in check)
                  + (f"; power at the margin {', '.join(_p(c.power) for c in check)}" if exp.margin is not None
                     else "") + "."]
    else:
        lines += ["", "For an arm with no grid, no candidate (ratios up to comparison.frontier_gap, 3 to 9 points) "
                  "kept its replicates readable often enough: a denser or wider pilot, more prompts for the drift, "
                  "or another declared value."]
    return lines

