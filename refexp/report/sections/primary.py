"""The report's first screen: the primary contrasts, pictured (``writing/forest_plot.py``: each Δ and interval against
the ±margin band) and one line each (Δ, interval, verdict, detectable difference; where the matched drift was
resampled, the share of the bootstrap's variance due to its noise), and the method named once with a pointer to
``docs/runs.md``; every other table follows it as secondary. summary.json: ``primary_contrasts`` and
``primary_contrasts_plot``.

Where the declared primary contrasts exist but none can be tested for want of seeds (the quickstart runs one seed:
no paired t), the first screen says so once and shows what the runs did instead: each arm's final accuracy and
retention against its start, its drift from the start, and the accuracy-vs-drift plot."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from refexp.report.reading.reduce import ACC, change_from_start
from refexp.report.sections.base import Section, Sweep
from refexp.report.sections.comparison import PLOT_CAPTIONS
from refexp.report.statistics.stats import Estimate, replicate_ci
from refexp.report.writing.blocks import Heading, Image, Paragraph, table_of
from refexp.report.writing.cells import cell_text
from refexp.report.writing.forest_plot import PLOT, ForestRow, caption, plot_forest

METHOD = ("Method: each difference pairs the runs by SFT start, seed and held-out prompt; the verdict is the primary "
          "family's (comparison.primary), Holm over the primary contrasts alone at alpha {alpha:g}, and the interval "
          "is the family's simultaneous (Bonferroni) one; the detectable difference is the smallest one these runs "
          "detect with 80% power. How a report is computed and read: `docs/runs.md` in the refexp repository "
          "(\"How to read a report\"), and *How to read this* at the end of this report. Every table below the "
          "primary contrasts is secondary: it claims nothing here.")

HEADER = ["contrast", "endpoint", "Δ", "simultaneous interval", "verdict", "detectable (80%)"]
X_NOISE = "x-noise share"
"""The column, where some contrast resampled its matched drift: the share of its bootstrap's variance due to the
drift measurement's own prompt noise (``drift_resample.x_noise_share``)."""


@dataclass(frozen=True)
class Line:
    """One primary contrast: the row of the first screen and of summary.json's ``primary_contrasts``."""

    algo: str
    contrast: str
    endpoint: str
    difference: Optional[float]
    interval: Optional[tuple[float, float]]
    level: Optional[float]
    verdict: str
    detectable: Optional[float]
    interval_text: str = ""
    """As the verdict prints it: "[-0.031, +0.105]", or "uninformative (1 df)" past the metric's range."""
    no_claim: str = ""
    """Why there is no verdict ("one paired seed"); empty with one."""
    equivalence: Optional[tuple[float, float]] = None
    """The two one-sided tests' (1 - 2 alpha/m) interval, where an equivalence margin is declared."""
    equivalence_level: Optional[float] = None
    x_noise: Optional[float] = None
    """A matched contrast's share of bootstrap variance due to its drift's own prompt noise; None: x taken as exact,
    or no matched x."""
    degenerate: bool = False
    """The Student t had no spread: a Δ and an interval, but no claim."""

    def cells(self, x_noise: bool = False) -> list[str]:
        """The table's row; ``x_noise``: with the ``X_NOISE`` column."""
        share = [f"{self.x_noise:.2f}" if self.x_noise is not None else ""] if x_noise else []
        if self.difference is None:
            return [self.contrast, self.endpoint, "", "", self.verdict, ""] + share
        return [self.contrast, self.endpoint, f"{self.difference:+.3f}",
                f"{self.interval_text} ({100 * self.level:.4g}%)", self.verdict, f"±{self.detectable:.3f}"] + share

    def to_dict(self) -> dict:
        return {"algo": self.algo, "contrast": self.contrast, "endpoint": self.endpoint,
                "difference": self.difference, "interval": list(self.interval) if self.interval else None,
                "interval_level": self.level, "verdict": self.verdict, "detectable_difference_80": self.detectable,
                "x_noise_share": self.x_noise}


def primary_lines(report) -> list[Line]:
    """Every primary contrast of every algorithm's table, in table order (no claim: its reason as the verdict)."""
    lines = []
    for algo, table in report.tables.items():
        for ep in table.endpoints:
            for row in table.rows:
                label = row.group.label
                if table.roles.get(ep.key, {}).get(label) != "primary":
                    continue
                v = table.verdicts[ep.key].get(label)
                contrast = f"{label} − {table.baseline}"
                if v is None:
                    c = row.paired.get(ep.key)
                    why = c.no_claim if c is not None else "no pair"
                    lines.append(Line(algo, contrast, ep.doc_name, None, None, None, f"no claim ({why})", None,
                                      no_claim=why))
                    continue
                lines.append(_line(algo, contrast, ep.doc_name, v))
    return lines + matched_lines(report)


def _line(algo: str, contrast: str, endpoint: str, v, x_noise: Optional[float] = None) -> Line:
    """The line of a verdict (``inference.Verdict``): its difference, family interval, word and detectable
    difference, its equivalence tests' interval (with a margin) and ``x_noise`` (a matched contrast's)."""
    e = v.equivalence
    return Line(algo, contrast, endpoint, v.result.point, tuple(v.interval), 1 - v.alpha / v.family_size,
                v.phrase if v.degenerate else v.word, v.mdd, v.interval_text,
                equivalence=tuple(e.interval) if e is not None else None,
                equivalence_level=1 - 2 * e.alpha if e is not None else None, x_noise=x_noise,
                degenerate=v.degenerate)


def matched_lines(report) -> list[Line]:
    """The primary contrasts declared at matched drift (``comparison.matched``), from the frontier section."""
    frontier = report.result("frontier")
    m = frontier.primary if frontier is not None else None
    if m is None:
        return []
    algo = next(iter(report.tables), "")
    out = []
    for r in m.rows:
        contrast = f"{r.arm} − {m.baseline}" + ("'s frontier" if m.estimand == "frontier" else "")
        endpoint = (f"{r.metric or m.metric} where each run's {m.axis.key} first passes {r.x:.3g} (crossing)"
                    if m.estimand == "crossing" else f"final {r.metric or m.metric} at matched {m.axis.key} {r.x:.3g}")
        v = m.verdicts.get(r.label)
        if v is None:
            out.append(Line(algo, contrast, endpoint, None, None, None, f"no claim ({r.no_claim})", None,
                            no_claim=r.no_claim))
            continue
        out.append(_line(algo, contrast, endpoint, v, r.x_noise_share))
    return out


def intro(report) -> str:
    """The sentences before the lines: what the primary contrasts are, or that none is declared, and the headline
    metric the tables lead with (``comparison.metric``)."""
    plan = report.plan
    if not plan.declared:
        return ("No comparison declared (exploratory): no primary contrast, so this report claims nothing in its "
                "summary; every table below is exploratory. " + headline(plan))
    if not plan.primary:
        return ("The comparison block declares no primary contrast (comparison.primary): this report claims nothing "
                "in its summary; every table below is secondary. " + headline(plan))
    axis, values = plan.matched_at
    if values:
        at = ', '.join(f'{x:.3g}' for x in values)
        where = (f"{plan.baseline}'s frontier across {plan.block.get('frontier_key')} at {axis} {at}"
                 if plan.matched_estimand == "frontier" else
                 f"{plan.baseline} where each run's {axis} first passes {at} (comparison.matched.estimand: crossing: "
                 f"runs part-way through, at whatever {plan.block.get('frontier_key')} reached it)")
        text = (f"Declared before the runs (comparison.primary, comparison.matched): {', '.join(plan.primary)}, each "
                f"against {where}, on {', '.join(plan.primary_metrics)}. " + headline(plan))
    else:
        text = (f"Declared before the runs (comparison.primary): {', '.join(plan.primary)}, each against "
                f"{plan.baseline}, on {', '.join(plan.primary_metrics)}. " + headline(plan))
    if not primary_lines(report):
        text += (" None of them could be paired group by group here (the baseline arm has several groups, or no run "
                 "of an arm completed): the tables below say why, and this report claims nothing in its summary.")
    return text


def headline(plan) -> str:
    """The sentence naming the metric the tables, the at-step columns and the frontier lead with."""
    if not plan.declared:
        return f"The tables lead with {plan.metric} (no comparison.metric declared)."
    steps = f" and at steps {', '.join(map(str, plan.at_steps))}" if plan.at_steps else ""
    return f"Headline metric (comparison.metric): {plan.metric}, compared at its final value{steps}."


ONE_SEED = "one paired seed"
"""The reason a contrast of one seed per arm makes no claim (``paired.unit_result``)."""
FROM_START = ("acc_final", "retention_final", "retention_change", "kl_init")
"""The main table's columns the arms' first screen shows, beside each arm's accuracy change from its start."""


def untestable(lines: list[Line]) -> bool:
    """Whether primary contrasts are declared and none can be tested for want of seeds: each makes no claim with
    one paired seed (the quickstart's one seed per arm). A contrast without a claim for another reason (a declared
    drift the runs did not reach) keeps the primary contrasts on the first screen, with that reason."""
    return bool(lines) and all(ln.difference is None and ln.no_claim.startswith(ONE_SEED) for ln in lines)


def _signed(est: Optional[Estimate]) -> str:
    text = cell_text(est)
    return text if text.startswith(("-", "—")) else "+" + text


def arm_rows(table) -> tuple[list[str], list[list[str]]]:
    """Each group of an algorithm's table against its start: final accuracy and its change from the start (each
    run's final minus its step-0 evaluation), final retention and its change, drift from the start (kl/init); a
    column no group has is left out."""
    header = ["arm", "final accuracy", "Δ accuracy from the start", "final retention", "Δ retention from the start",
              "drift from the start (kl/init)"]
    rows = []
    for row in table.rows:
        acc, retention, change, drift = (row.cells.get(k) for k in FROM_START)
        gain = replicate_ci((r.sft_start, change_from_start(r, ACC)) for r in row.group.completed)
        rows.append([(acc, cell_text), (gain, _signed), (retention, cell_text), (change, _signed),
                     (drift, cell_text)])
    keep = [i for i in range(5) if any(r[i][0] is not None for r in rows)]
    return ([header[0]] + [header[i + 1] for i in keep],
            [[row.group.label] + [cells[i][1](cells[i][0]) for i in keep] for row, cells in zip(table.rows, rows)])


def _no_claim_sentence(report) -> str:
    """Said once: no primary contrast makes a claim, what was declared, and what the table below shows."""
    plan = report.plan
    return (f"One seed: no claim. The declared primary contrasts ({', '.join(plan.primary)}, each against "
            f"{plan.baseline}, on {', '.join(plan.primary_metrics)}) need two paired seeds or more. Below, each arm "
            f"against the start it trained from; the tables further down hold every number, none of them a claim.")


def from_start_blocks(report, lines: list[Line]) -> list:
    """The first screen where no primary contrast can be tested: the sentence, then per algorithm its arms against
    their start and its accuracy-vs-drift plot."""
    out = [Heading("Each arm against its start"), Paragraph(_no_claim_sentence(report))]
    algos = list(dict.fromkeys(ln.algo for ln in lines))
    for algo in algos:
        header, rows = arm_rows(report.tables[algo])
        if len(algos) > 1:
            header[0] = f"{algo.upper()} arm"
        out.append(table_of(header, rows))
        plot = report.plots.get(algo, {}).get("frontier")
        if plot is not None:
            out.append(Image(plot, f"{algo.upper()}: {PLOT_CAPTIONS['frontier']}"))
    return out


def forest_rows(lines: list[Line]) -> list[ForestRow]:
    """The forest plot's rows, one per line in its order: a contrast without a claim (none made, or a degenerate t)
    has its words and no interval."""
    algos = len({ln.algo for ln in lines}) > 1
    rows = []
    for ln in lines:
        label = (f"{ln.algo.upper()}: " if algos else "") + f"{ln.contrast}\n{ln.endpoint}"
        if ln.difference is None or ln.degenerate:
            rows.append(ForestRow(label, "degenerate t: no claim" if ln.degenerate else "no claim"))
            continue
        word = ln.verdict + (" (uninformative)" if ln.interval_text.startswith("uninformative") else "")
        rows.append(ForestRow(label, word, ln.difference, ln.interval, ln.level, ln.equivalence,
                              ln.equivalence_level))
    return rows


class PrimaryContrasts(Section):
    name = "primary_plot"  # the forest plot's path (``after``: it reads the frontier section's contrasts)

    def after(self, report, sweep: Sweep) -> Optional[Path]:
        lines = primary_lines(report)
        if not lines or untestable(lines):
            return None
        sweep.plots_dir.mkdir(parents=True, exist_ok=True)
        return plot_forest(sweep.plots_dir / PLOT, forest_rows(lines), report.plan.margin)

    def blocks(self, report) -> list:
        lines = primary_lines(report)
        if untestable(lines):
            return from_start_blocks(report, lines)
        out = [Heading("Primary contrasts"), Paragraph(intro(report))]
        if report.result(self.name) is not None:
            out.append(Image(report.result(self.name), caption(forest_rows(lines), report.plan.margin)))
        if lines:
            x_noise = any(ln.x_noise is not None for ln in lines)
            out.append(table_of(HEADER + [X_NOISE] * x_noise, [ln.cells(x_noise) for ln in lines], numeric=False))
        return out + [Paragraph(METHOD.format(alpha=report.plan.alpha), markup=True)]

    def summary(self, report) -> dict:
        plot = report.result(self.name)
        return {"primary_contrasts": [ln.to_dict() for ln in primary_lines(report)],
                "primary_contrasts_plot": plot.relative_to(report.sweep_dir).as_posix() if plot else None}
