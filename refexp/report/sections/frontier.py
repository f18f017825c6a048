"""The frontier and tuned-comparison sections of a report, where the comparison block declares
``comparison.frontier_key`` or ``comparison.select``: the primary contrasts at a declared matched drift, each arm's
accuracy against drift across the key with the matched tables and plots, each arm at its setting chosen on
validation, the oracle's choice on test (an upper bound), and the same within each SFT start. What ``frontier``,
``declared_matched``, ``selection`` and ``oracle`` compute, gathered once (``make``) and written as blocks and
summary.json's ``frontier``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from refexp.report.reading.comparison_plan import ComparisonPlan
from refexp.report.reading.load import Run, sft_start_keys
from refexp.report.sections.base import Section, Sweep
from refexp.report.sections.within_start import WITHIN_START
from refexp.report.statistics.declared_matched import declared_matched
from refexp.report.statistics.frontier import MatchedDrift, curves, matched, planned_runs
from refexp.report.statistics.frontier_points import DRIFT_AXIS, RETENTION_AXIS
from refexp.report.statistics.oracle import TITLE as ORACLE_TITLE
from refexp.report.statistics.oracle import Oracle, oracle_choice
from refexp.report.statistics.selection import Selection, choose
from refexp.report.writing.blocks import Heading, Image, Paragraph, table_of
from refexp.report.writing.frontier_plots import plot_frontier_curves
from refexp.report.writing.table import verdict_cell

HOW_TO_READ = (
    "Each line is one arm across the frontier key's values (labelled at each point): the mean over its runs of "
    "the final x and the final test metric, 95% intervals on both axes. Higher at equal x is better. The matched "
    "table compares each arm with the baseline at two x values inside the range both arms' curves cover in "
    "every common replicate (SFT start and seed): per replicate, each arm's curve is interpolated between its "
    "two runs nearest that x (piecewise-linear in log kl/init; linear in retention), compared only where those "
    "two runs are within the declared gap of the frontier key (comparison.frontier_gap) and, on the declared matched "
    "axis, within comparison.matched.max_gap of each other (otherwise the row says \"not matched\" and counts the "
    "replicates that fail, by reason), and the interpolated "
    "per-prompt scores are bootstrapped (seeds, or SFT starts then seeds, with one prompt resample for every "
    "run; where the runs logged their drift per prompt, each run's x is resampled too), paired by start, seed and "
    "prompt, together with Student's t over the per-seed (with several starts, "
    "per-start mean) differences (a difference counts only where both reject; a degenerate t makes no claim). "
    "The table's text says where each compared row's curves were read (the two runs' x, and how far apart) and its "
    "point estimate with the chord drawn in the other scale (linear for log kl/init, log for retention). "
    "Holm's step-down over the table's family decides each verdict, beside its simultaneous (Bonferroni) "
    "interval, as in the tables above (docs/runs.md, \"How to read a report\").")


@dataclass
class FrontierReport:
    """The matched tables (one per axis the runs have), the frontier plots and the tuned comparison."""

    key: str
    metric: str
    matched: list[MatchedDrift] = field(default_factory=list)
    plots: dict[str, Path] = field(default_factory=dict)
    selection: Optional[Selection] = None
    primary: Optional[MatchedDrift] = None
    """The primary contrasts at the declared matched values (``comparison.matched``), over every counted run."""
    oracle: Optional[Oracle] = None
    """Each arm's setting chosen on the test metric itself: an upper bound, reported apart (``oracle.py``)."""
    within: dict[str, "FrontierReport"] = field(default_factory=dict)
    """With several SFT starts, SFT start -> the same sections over that start's runs alone (conditional on it:
    seeds, then prompts, are the units), without plots."""


def make(runs: list[Run], plan: ComparisonPlan, plots_dir: Path) -> Optional[FrontierReport]:
    """The sections the plan declares (``frontier_key``, ``select``); None when it declares neither."""
    block = plan.block or {}
    key, select = block.get("frontier_key") or "", (block.get("select") or {}).get("metric")
    if not key and not select:
        return None
    metric = plan.metric
    out = _sections(runs, plan, key, metric, plots_dir)
    out.primary = declared_matched(runs, plan) if key else None
    out.oracle = oracle_choice(out.selection) if out.selection is not None else None
    starts = sft_start_keys(planned_runs(runs, plan))
    if len(starts) > 1:
        out.within = {s: _sections([r for r in runs if r.sft_start == s], plan, key, metric, None) for s in starts}
    return out


def _sections(runs: list[Run], plan: ComparisonPlan, key: str, metric: str,
              plots_dir: Optional[Path]) -> FrontierReport:
    """The matched tables, the tuned comparison and (with a ``plots_dir``) the frontier plots of ``runs``."""
    out = FrontierReport(key, metric, selection=choose(runs, plan))
    if key:
        for axis in (DRIFT_AXIS, RETENTION_AXIS):
            m = matched(runs, plan, axis, metric)
            if m is None:
                continue
            out.matched.append(m)
            if plots_dir is None:
                continue
            plots_dir.mkdir(parents=True, exist_ok=True)
            name = "frontier_" + axis.key.replace("/", "_")
            p = plot_frontier_curves(plots_dir / f"{name}.png", curves(runs, plan, axis, metric), axis, metric, key)
            if p is not None:
                out.plots[name] = p
    return out


def _rows(m: MatchedDrift) -> list[list[str]]:
    rows = []
    for r in m.rows:
        v = m.verdicts.get(r.label)
        if v is None:
            rows.append([r.arm, "—" if r.x is None else f"{r.x:.3g}", "—", "—", "—", r.no_claim or "no claim"])
        else:
            rows.append([r.arm, f"{r.x:.3g}", f"{v.result.point:+.3f}", v.interval_text, v.p_text, verdict_cell(v)])
    return rows


def _header(m: MatchedDrift) -> list[str]:
    x = f"matched {m.axis.key}" if m.estimand == "frontier" else f"{m.axis.key} passed"
    return ["arm", x, f"Δ {m.metric} vs {m.baseline}", "simultaneous interval", "Holm p", "verdict"]


def oracle_header(o: Oracle) -> list[str]:
    return ["arm", "oracle setting (test)", f"oracle mean final {o.metric}", "validation choice",
            f"its mean final {o.metric}", "oracle − validation choice", "settings tried"]


def oracle_rows(o: Oracle) -> list[list[str]]:
    def num(x: Optional[float], sign: bool = False) -> str:
        return "—" if x is None else (f"{x:+.3f}" if sign else f"{x:.3f}")

    return [[r.arm, r.oracle.shown if r.oracle else "—", num(r.oracle_test), r.chosen.shown if r.chosen else "—",
             num(r.chosen_test), num(r.given_up, sign=True), str(r.tried)] for r in o.rows]


def oracle_summary(o: Oracle) -> dict:
    """summary.json's entry: labelled an upper bound, apart from every verdict."""
    return {"label": ORACLE_TITLE, "upper_bound": True, "metric": o.metric, "notes": o.notes, "text": o.text, "rows": [
        {"arm": r.arm, "oracle": dict(r.oracle.settings) if r.oracle else None, "oracle_test": r.oracle_test,
         "validation_choice": dict(r.chosen.settings) if r.chosen else None, "validation_choice_test": r.chosen_test,
         "given_up": r.given_up, "settings_tried": r.tried} for r in o.rows]}


def selection_rows(sel: Selection) -> list[tuple[str, str]]:
    """The setup block's rows: the rule, each arm's chosen setting and budget, and the notes."""
    rows = [("selection rule", sel.rule)]
    for arm, c in sel.choices.items():
        chosen = (f"{c.chosen.shown} ({c.chosen.score:.3f})" if c.chosen and c.chosen.score is not None
                  else "none chosen")
        n = len(c.candidates)
        bias = "" if c.optimism is None else f"; validation-minus-test gap above runners-up' {c.optimism:+.3f}"
        rows.append((f"chosen for {arm}", f"{chosen}; {n} setting{'s' * (n != 1)} tried{bias}"))
    return rows + [("selection note", n) for n in sel.notes]


def _matched_blocks(m: MatchedDrift) -> list:
    return [Paragraph(m.text, lead=f"Matched {m.axis.key}."), table_of(_header(m), _rows(m))]


def blocks(fr: FrontierReport) -> list:
    """The sections as blocks."""
    out: list = []
    if fr.primary is not None:
        title = (f"Primary contrasts at matched {fr.primary.axis.key}" if fr.primary.estimand == "frontier" else
                 f"Primary contrasts where {fr.primary.axis.key} first passes the declared value (crossing)")
        out += [Heading(title), Paragraph(fr.primary.text),
                table_of(_header(fr.primary), _rows(fr.primary))]
    if fr.matched:
        out += [Heading(f"Frontier across {fr.key}"), Paragraph(HOW_TO_READ)]
        for m in fr.matched:
            out += _matched_blocks(m)
        out += [Image(path, f"{fr.metric} vs {name}", html_alt=name) for name, path in fr.plots.items()]
    if fr.selection is not None:
        out += [Heading("Each arm at its best"), Paragraph(fr.selection.text)]
    if fr.oracle is not None:
        out += [Heading(ORACLE_TITLE), Paragraph(fr.oracle.text),
                table_of(oracle_header(fr.oracle), oracle_rows(fr.oracle), numeric=False)]
    for start, inside in fr.within.items():
        out += [Heading(f"Within SFT start {start}"), Paragraph(WITHIN_START)]
        for m in inside.matched:
            out += _matched_blocks(m)
        if inside.selection is not None:
            out += [Paragraph(inside.selection.text, lead="Each arm at its best."),
                    table_of(["setup", ""], selection_rows(inside.selection), numeric=False)]
    return out


def summary(fr: FrontierReport, sweep_dir: Path) -> dict:
    """The numbers for summary.json."""
    sel = fr.selection
    return {
        "within_sft_start": {s: summary(inside, sweep_dir) for s, inside in fr.within.items()},
        "key": fr.key, "metric": fr.metric,
        "matched": [_matched_summary(m) for m in fr.matched],
        "primary": None if fr.primary is None else _matched_summary(fr.primary),
        "plots": {k: p.relative_to(sweep_dir).as_posix() for k, p in fr.plots.items()},
        "oracle": None if fr.oracle is None else oracle_summary(fr.oracle),
        "selection": None if sel is None else {
            "rule": sel.rule, "budgets": sel.budgets, "notes": sel.notes, "text": sel.text,
            "validation_prompts": sel.budget, "refused": sel.refused,
            "chosen": {a: (dict(c.chosen.settings) if c.chosen else None) for a, c in sel.choices.items()},
            "test_from_selected_runs": True,
            "optimism": {a: c.optimism for a, c in sel.choices.items()},
            "verdicts": {k: {"difference": v.result.point, "interval": list(v.interval), "p_holm": v.p_holm,
                             "verdict": v.word, "verdict_text": v.phrase} for k, v in sel.verdicts.items()}},
    }


def _matched_summary(m: MatchedDrift) -> dict:
    """One matched table's numbers for summary.json."""
    return {"axis": m.axis.key, "estimand": m.estimand, "baseline": m.baseline, "text": m.text, "rows": [
        {"arm": r.arm, "label": r.label, "x": r.x, "seeds": r.seeds, "no_claim": r.no_claim or None,
         "x_resampled": r.x_resampled, "x_noise_share": r.x_noise_share,
         "brackets": {who: list(b) for who, b in r.brackets.items()} or None,
         "other_chord_difference": r.other_chord,
         **({"difference": m.verdicts[r.label].result.point, "interval": list(m.verdicts[r.label].interval),
             "p_holm": m.verdicts[r.label].p_holm, "verdict": m.verdicts[r.label].word,
             "verdict_text": m.verdicts[r.label].phrase, "detectable_difference_80": m.verdicts[r.label].mdd}
            if r.label in m.verdicts else {})} for r in m.rows]}


class Frontier(Section):
    name = "frontier"

    def compute(self, sweep: Sweep) -> Optional[FrontierReport]:
        return make(sweep.runs, sweep.plan, sweep.plots_dir)

    def setup_rows(self, result: Optional[FrontierReport], algo: str, sweep: Sweep) -> list[tuple[str, str]]:
        """The settings the tuned comparison chose, in the setup block of the arms' algorithm."""
        if result is None or result.selection is None:
            return []
        if not any(sweep.plan.arm(r) is not None for g in sweep.groups[algo] for r in g.runs):
            return []
        return selection_rows(result.selection)

    def blocks(self, report) -> list:
        return [] if report.frontier is None else blocks(report.frontier)

    def summary(self, report) -> dict:
        return {"frontier": None if report.frontier is None else summary(report.frontier, report.sweep_dir)}
