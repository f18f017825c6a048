"""Write the report: report.md (plots by relative path), report.html (one self-contained file,
plots as base64 data URIs, no scripts, no external references) and summary.json (the numbers).

Every file is written to a temporary name and renamed, so a reader never sees half a report and
re-running on a sweep that is still going simply replaces the previous one.
"""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path

from refexp.record.atomic import write_text_atomic

from refexp.report.reading.reduce import COLUMNS, TAIL
from refexp.report.statistics import own_change
from refexp.report.statistics.summary import DEFAULT_TARGET_MARGIN
from refexp.report.writing import first_screen, frontier_report, gao_section, gold_peak_section
from refexp.report.writing.frontier_report import WITHIN_START
from refexp.report.writing.table import error_cell, header_and_cells

HOW_TO_READ = (
    "Each row is one group of runs that differ only by seed; each cell is the mean across the group's "
    "completed seeds ± the half-width of a 95% Student-t confidence interval (t with n−1 degrees of "
    "freedom × sample std / √n); \"(n=1)\" means one seed, so no seed interval; with runs from several SFT starts "
    "the interval is over the starts' means (\"(2 SFT starts)\"), a start being the replicate. The accuracy columns' "
    "intervals also carry the evaluation's binomial noise: every run is measured on one set of N held-out "
    "prompts, a sample of the task's problems that more seeds do not average away, so the half-width is "
    "√(t-part² + (1.96·√(p(1−p)/N))²) (one seed: the binomial part alone). These per-group intervals "
    "describe each group alone: whether two groups differ is read from the paired Δ column, not from whether "
    "their intervals overlap. "
    "*final acc* is the last held-out `eval/accuracy` and *best acc* the held-out accuracy at the evaluation "
    "with the best validation accuracy (`val/accuracy`; without a validation split, the maximum of `eval/accuracy`, "
    "which is optimistic by the evaluation noise it selects on); runs on "
    "preference data alone (`task=preference`) have no task accuracy and show *final/best held-out pref acc* "
    "(`eval/pref_accuracy`: the share of held-out pairs whose implicit reward ranks chosen above rejected) "
    "and *final held-out margin* (`eval/pref_margin`) instead, which also take accuracy's place in the plots; "
    f"*reward* (GRPO `reward/mean`; DPO `rewards/accuracies` and `rewards/margins`) and *kl/ref* average the "
    f"last {TAIL} logged steps, so a resetting strategy's saw-tooth does not decide the number; *kl/init* "
    "is the last measured drift from the SFT start the run began from. *steps to acc≥T* is the first "
    "step whose held-out accuracy reached the target T (\"never\" when no seed did; \"k/n seeds\" when "
    "only some did, and then the mean is over those); by default T is halfway from the start "
    "accuracy to the best group's final accuracy, so the column says who gets there first (start + "
    f"{DEFAULT_TARGET_MARGIN} when no group gained). *ref cost* is the share of step time spent in the reference "
    "forward (Σ perf/ref_fwd_s / Σ perf/step_s) and *peak RSS MB* the largest `mem/peak_rss_mb`. "
    "*final retention* is the last `eval/retention`: held-out exact match on the skills the SFT stage taught and RL "
    "does not train (`task.ops` minus `task.rl_ops`), what a run keeps of its start; it is a paired endpoint of its "
    "own, like final accuracy. *Δ retention* is its last value minus its step-0 value (one set of prompts), and "
    "*final pass@k* the last `eval/pass_at_k`, the chance that one of k completions sampled at the training "
    "temperature is right: it falls when the policy's distribution collapses. "
    "*acc@S* and *gain after S* (columns asked for with `--at-steps S`) are the held-out accuracy at the last "
    "evaluation at or before step S and the final accuracy minus it: a gain whose interval excludes 0 says the "
    "group kept improving after S; under another headline metric (`comparison.metric`, e.g. `eval/gold`) they are "
    "that metric's (*gold@S*, *gold gain after S*), and its final value leads the verdicts. "
    "*Δ … vs baseline (paired, simultaneous …%)* is this group's final number minus the baseline group's, "
    "paired by seed and by held-out prompt: a paired hierarchical percentile bootstrap of the per-prompt scores "
    "in each run's `eval_outcomes.jsonl` (seeds resampled, and one prompt resample per replicate serving every "
    "run, since every run is scored on one set of test prompts), so the interval carries the test prompts' noise as well "
    "as the seeds', and a Student-t test over the per-seed differences, which a bootstrap of a few seeds "
    "understates: a difference counts only where both reject (the larger p, the hull of the two intervals; one "
    "paired seed: no claim; identical per-seed differences: *degenerate t*, no claim). The *verdict* is decided "
    "by Holm's step-down over the m comparisons against the baseline (*Holm p*, the Holm-adjusted p-value, "
    "<= alpha): *higher* or *lower*; the interval is the simultaneous (Bonferroni) 1 − alpha/m one, and where "
    "Holm rejects while it still covers 0 the verdict says so. Otherwise *equivalent within ±m* where two "
    "one-sided tests put the difference inside the equivalence margin (`--equivalence-margin`, else the "
    "comparison block's `equivalence_margin`), else *inconclusive*: not a claim of no difference. An interval "
    "reaching past ±1 on a difference of shares of prompts prints as *uninformative (n df)*. Each verdict "
    "sentence gives the smallest difference these seeds and prompts would detect with 80% power. Runs written before `eval_outcomes.jsonl` existed fall back to the Student-t "
    "interval over the per-seed differences, marked *seed-only* (the prompts' noise is not included); the "
    "*seed-only t 95%* column shows that interval for every group. With several SFT starts (`sft.seed=0,1`) "
    "the runs pair by start and seed, the seeds are nested in the starts (the bootstrap resamples starts, then "
    "seeds within start, then prompts) and the t is over the per-start mean differences (*SFT-start-mean t "
    "95%*), n starts − 1 degrees of freedom: a start is the independent unit, a seed is not; with two starts "
    "that t has one degree of freedom and separates little, so each algorithm's table and verdicts are repeated "
    "*within each SFT start*, conditional on it (its seeds, then prompts): a difference there holds for that "
    "start. *What each group kept* is each group's final `eval/retention` minus its own step-0 evaluation, "
    "paired by prompt within each run, with the verdict table's intervals and rule, Holm over the algorithm's "
    "groups. *Gold at its peak* (runs with a learned reward) is each group's test `eval/gold` at the evaluation "
    "step its validation gold chose, minus its step-0 evaluation, with the kept table's intervals and rule; *each arm at "
    "its gold peak* compares the arms' best such points with the baseline's (docs/runs.md). "
    "Runs outside the comparison the "
    "experiment declared (other seeds or arms), or from another refexp commit or thread count than most "
    "runs, are listed in the setup block and left out of the verdict (`--allow-mixed` counts them). "
    "*chosen Δlogp* (DPO) is the last `logps/chosen_delta`: how far the chosen "
    "completions' summed log-prob moved from its start; a *flag* names the groups where it fell with its "
    "interval below 0 (likelihood displacement). "
    "In the plots one colour is one strategy (line styles tell its groups apart) and bands are the 95% "
    "interval of the mean across seeds (across SFT starts' means where the runs come from several), as in the "
    "table; on the accuracy-vs-drift plot (each group's "
    "final evaluation, 95% intervals on both axes), up and to the left is better: more accuracy for less "
    "drift. Failed and unfinished runs are left out of every number and listed at the end."
)

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1200px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
table{border-collapse:collapse;margin:1em 0;font-size:.9em}
th,td{border:1px solid #ccc;padding:.3em .6em;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
code{background:#f3f3f3;padding:0 .2em}
img{max-width:100%;display:block;margin:1em 0;border:1px solid #eee}
.note{color:#555}.bad td{text-align:left}
"""


def _write(path: Path, text: str) -> Path:
    return write_text_atomic(path, text, encoding="utf-8")


def _counts(report) -> str:
    states: dict[str, int] = {}
    for r in report.runs:
        key = "completed" if r.problem is None else r.state
        states[key] = states.get(key, 0) + 1
    parts = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
    return f"{len(report.runs)} runs: {parts}" if report.runs else "no runs found"


def _target_line(table) -> str:
    if table.target is None:
        return "No held-out accuracy (`eval/accuracy`) logged: no steps-to-target column."
    return f"Target accuracy T = {table.target:.3g} ({table.target_note})."


# ---------------------------------------------------------------- markdown
_HTML_OPENER = re.compile(r"<(?=[A-Za-z/!?])")
"""A ``<`` that Markdown would read as raw HTML: a tag (``<script>``, ``<svg onload=...>``, ``</b>``), a comment or
declaration (``<!``), a processing instruction (``<?``) or an autolink (``<http://...>``)."""


def _no_raw_html(markdown: str) -> str:
    """``markdown`` with every ``<`` that could open raw HTML written ``&lt;``, which renders as ``<``: a report
    prints run names, completions and prompts it did not write, and report.md, like report.html, shows them as text.
    The report's own Markdown holds no HTML; a ``<`` before a space, a digit or ``=`` (``p <= alpha``) stays."""
    return _HTML_OPENER.sub("&lt;", markdown)


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md_table(header: list[str], body: list[list[str]], numeric: bool = True) -> list[str]:
    """A pipe table; ``numeric`` right-aligns every column after the first (the numbers)."""
    rest = "---:" if numeric else ":---"
    lines = ["| " + " | ".join(map(_md_cell, header)) + " |",
             "|" + "|".join([":---"] + [rest] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in body]
    return lines


def _problem_cells(p) -> list[str]:
    return [p.name, p.algo, p.label, p.state, error_cell(p.error)]


_PROBLEM_HEADER = ["run", "algo", "group", "status", "error"]
_SAMPLE_HEADER = ["algo", "group", "run", "prompt", "completion", "answer", "reward"]


def _short(text, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _sample_rows(report, k: int = 3) -> list[list[str]]:
    """Up to ``k`` final-evaluation samples of each group's first completed run."""
    rows = []
    for algo, table in report.tables.items():
        for row in table.rows:
            run = row.group.completed[0] if row.group.completed else None
            for sample in (run.final_samples(k=k) if run is not None else []):
                rows.append([algo, row.group.label, run.name, _short(sample.get("prompt", "")),
                             _short(sample.get("completion", "")), _short(sample.get("answer", "")),
                             _reward_cell(sample.get("reward", float("nan")))])
    return rows


def _reward_cell(reward) -> str:
    """A sample's reward: a number to 3 significant digits; anything else (a hand-edited or foreign samples.jsonl)
    as written, said to be no number."""
    if isinstance(reward, (int, float)):
        return f"{reward:.3g}"
    return f"{_short(reward, 40)} (not a number)"


_PLOT_CAPTIONS = {
    "reward": "Reward vs step", "accuracy": "Held-out accuracy vs step",
    "frontier": "Accuracy vs drift from init (kl/init)", "kl_ref": "kl/ref vs step",
    "ref_cost": "Reference cost", "gold": "Gold and proxy reward vs drift from init (kl/init)",
}


def render_markdown(report) -> str:
    out = [f"# Reference-strategy report: {report.sweep_dir.name}", "",
           f"Sweep `{report.shown_dir}`: {_counts(report)}.", "", "## Primary contrasts", "",
           first_screen.intro(report), ""]
    lines = first_screen.primary_lines(report)
    if lines:
        out += _md_table(first_screen.HEADER, [ln.cells() for ln in lines], numeric=False) + [""]
    out += [first_screen.METHOD.format(alpha=report.plan.alpha), ""]
    for algo, table in report.tables.items():
        header, body = header_and_cells(table)
        out += [f"## {algo.upper()}", ""]
        for i, paragraph in enumerate(table.verdict.split("\n\n") if table.verdict else []):
            out += [("**Verdict.** " if i == 0 else "") + paragraph, ""]
        out += [f"**Flag.** {f}" for f in table.flags] + ([""] if table.flags else [])
        out += _md_table(["setup", ""], [list(r) for r in report.setup.get(algo, [])], numeric=False) + [""]
        out += [_target_line(table), ""] + _md_table(header, body) + [""]
        for kind, path in report.plots.get(algo, {}).items():
            rel = path.relative_to(report.sweep_dir).as_posix()
            out += [f"![{algo.upper()}: {_PLOT_CAPTIONS.get(kind, kind)}]({rel})", ""]
        kept = report.kept.get(algo)
        if kept is not None:
            out += [f"**What each group kept.** {kept.text}", ""]
            out += _md_table(own_change.header(kept), own_change.rows(kept)) + [""]
        if algo in report.peaks:
            out += gold_peak_section.markdown(report.peaks[algo], report.plan.alpha, _md_table)
        for start, inside in report.within.get(algo, {}).items():
            out += [f"### {algo.upper()} within SFT start {start}", "", WITHIN_START, ""]
            for paragraph in inside.verdict.split("\n\n") if inside.verdict else []:
                out += [paragraph, ""]
            header_s, body_s = header_and_cells(inside)
            out += _md_table(header_s, body_s) + [""]
    if report.frontier is not None:
        out += frontier_report.markdown(report.frontier, report.sweep_dir, _md_table)
    if report.gao is not None:
        out += gao_section.markdown(report.gao, report.sweep_dir, _md_table)
    samples = _sample_rows(report)
    if samples:
        out += ["## What the models wrote", "",
                "The first held-out prompts' greedy completions at each group's final evaluation (its first "
                "completed seed; all of them in the run's `samples.jsonl`).", ""]
        out += _md_table(_SAMPLE_HEADER, samples, numeric=False) + [""]
    out += ["## Runs not counted", ""]
    if report.problems:
        out += _md_table(_PROBLEM_HEADER, [_problem_cells(p) for p in report.problems], numeric=False)
    else:
        out.append("None: every run found completed.")
    if report.notes:
        out += ["", "## Notes", ""] + [f"- {n}" for n in report.notes]
    out += ["", "## How to read this", "", HOW_TO_READ + " " + first_screen.FAMILIES]
    return _no_raw_html("\n".join(out) + "\n")


# ---------------------------------------------------------------- html
def _html_table(header: list[str], body: list[list[str]], cls: str = "") -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    rows = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in body)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'


def _data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _md_emphasis_to_html(text: str) -> str:
    """The how-to-read paragraph uses *x* and `x`; turn exactly those into <em>/<code>."""
    text = html.escape(text)
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    return re.sub(r"\*([^*]+)\*", r"<em>\1</em>", text)


def render_html(report) -> str:
    e = html.escape
    title = f"Reference-strategy report: {report.sweep_dir.name}"
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{e(title)}</title>"
             f"<style>{_CSS}</style></head><body>",
             f"<h1>{e(title)}</h1>",
             f"<p class=\"note\">Sweep <code>{e(report.shown_dir)}</code>: {e(_counts(report))}.</p>",
             "<h2>Primary contrasts</h2>", f"<p>{e(first_screen.intro(report))}</p>"]
    lines = first_screen.primary_lines(report)
    if lines:
        parts.append(_html_table(first_screen.HEADER, [ln.cells() for ln in lines]))
    parts.append(f"<p>{_md_emphasis_to_html(first_screen.METHOD.format(alpha=report.plan.alpha))}</p>")
    for algo, table in report.tables.items():
        header, body = header_and_cells(table)
        parts.append(f"<h2>{e(algo.upper())}</h2>")
        for i, paragraph in enumerate(table.verdict.split("\n\n") if table.verdict else []):
            parts.append(f"<p>{'<strong>Verdict.</strong> ' if i == 0 else ''}{e(paragraph)}</p>")
        parts += [f"<p><strong>Flag.</strong> {e(f)}</p>" for f in table.flags]
        parts += [_html_table(["setup", ""], [list(r) for r in report.setup.get(algo, [])], "bad"),
                  f"<p>{e(_target_line(table))}</p>", _html_table(header, body)]
        for kind, path in report.plots.get(algo, {}).items():
            alt = f"{algo.upper()}: {_PLOT_CAPTIONS.get(kind, kind)}"
            parts.append(f'<img alt="{e(alt)}" src="{_data_uri(path)}">')
        kept = report.kept.get(algo)
        if kept is not None:
            parts += [f"<p><strong>What each group kept.</strong> {e(kept.text)}</p>",
                      _html_table(own_change.header(kept), own_change.rows(kept))]
        if algo in report.peaks:
            parts += gold_peak_section.html_parts(report.peaks[algo], report.plan.alpha, _html_table, e)
        for start, inside in report.within.get(algo, {}).items():
            parts += [f"<h3>{e(algo.upper())} within SFT start {e(start)}</h3>", f"<p>{e(WITHIN_START)}</p>"]
            parts += [f"<p>{e(p)}</p>" for p in (inside.verdict.split("\n\n") if inside.verdict else [])]
            parts.append(_html_table(*header_and_cells(inside)))
    if report.frontier is not None:
        parts += frontier_report.html_parts(report.frontier, _html_table, _data_uri)
    if report.gao is not None:
        parts += gao_section.html_parts(report.gao, _html_table, _data_uri)
    samples = _sample_rows(report)
    if samples:
        parts += ["<h2>What the models wrote</h2>", _html_table(_SAMPLE_HEADER, samples, "bad")]
    parts.append("<h2>Runs not counted</h2>")
    if report.problems:
        parts.append(_html_table(_PROBLEM_HEADER, [_problem_cells(p) for p in report.problems], "bad"))
    else:
        parts.append("<p>None: every run found completed.</p>")
    if report.notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{e(n)}</li>" for n in report.notes) + "</ul>")
    parts.append(f"<h2>How to read this</h2><p>{_md_emphasis_to_html(HOW_TO_READ + ' ' + first_screen.FAMILIES)}</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------- json
def _comparison_dict(c, v, baseline: str, role: str) -> dict:
    """One group's comparison with the baseline on one endpoint: its role (primary, secondary, exploratory), its
    seeds, the family verdict and numbers (None without a claim), and the seed-only t interval."""
    out = {"role": role, "seeds": c.seeds, "sft_starts": c.starts, "no_claim": c.no_claim or None,
           "seed_only_t95": c.seed_t.to_dict() if c.seed_t else None}
    if v is not None:
        out |= {"difference": v.result.point, "interval": list(v.interval), "interval_kind":
                f"Bonferroni {1 - v.alpha / v.family_size:.6g}", "p_holm": v.p_holm, "p_unadjusted": v.result.p_value,
                "verdict": v.word, "verdict_text": v.phrase, "degenerate_t": v.degenerate,
                "interval_covers_zero": v.interval_covers_zero, "uninformative": v.uninformative,
                "method": v.result.method, "family_size": v.family_size,
                "detectable_difference_80": v.mdd, "seed_only": c.seed_only, "sentence": v.sentence(baseline)}
    return out


def summary_dict(report) -> dict:
    """Every number of the tables, machine-readable; non-finite numbers are null."""
    algos = {}
    for algo, table in report.tables.items():
        groups = []
        for row in table.rows:
            g = row.group
            t = row.to_target
            groups.append({
                "label": g.label, "strategy": g.strategy, "settings": dict(g.settings),
                "runs": [r.name for r in g.runs], "completed_runs": [r.name for r in g.completed],
                "seeds": row.seeds, "n_completed": row.n_completed, "n_total": len(g.runs),
                "metrics": {c.key: (row.cells[c.key].to_dict() if row.cells.get(c.key) else None)
                            for c in (*COLUMNS, *report.extra_columns)},
                "paired_vs_baseline": {key: _comparison_dict(c, table.verdicts[key].get(g.label), table.baseline,
                                                              table.roles[key][g.label])
                                       for key, c in row.paired.items()} or None,
                "steps_to_target": None if t is None else {
                    "reached": t.reached, "n_with_eval": t.n,
                    "estimate": t.estimate.to_dict() if t.estimate else None},
            })
        algos[algo] = {"target": table.target, "target_note": table.target_note, "flags": table.flags,
                       "columns": [c.key for c in table.columns], "groups": groups,
                       "baseline": table.baseline, "headline": table.headline.key if table.headline else None,
                       "verdict": table.verdict, "setup": dict(report.setup.get(algo, [])),
                       "kept": own_change.summary(report.kept[algo]) if algo in report.kept else None,
                       "gold_peak": (gold_peak_section.summary(report.peaks[algo], report.plan.alpha)
                                     if algo in report.peaks else None),
                       "within_sft_start": {start: {"verdict": inside.verdict, "paired_vs_baseline": {
                           row.group.label: {key: _comparison_dict(c, inside.verdicts[key].get(row.group.label),
                                                                   inside.baseline, inside.roles[key][row.group.label])
                                             for key, c in row.paired.items()}
                           for row in inside.rows}} for start, inside in report.within.get(algo, {}).items()}}
    return {
        **report.rendered,  # read before any file was written (build._build)
        "sweep_dir": report.shown_dir,
        "confidence": 0.95,
        "comparison": {"kind": report.plan.kind, "declared": report.plan.block, "baseline": report.plan.baseline,
                       "alpha": report.plan.alpha, "equivalence_margin": report.plan.margin,
                       "metric": report.plan.metric,
                       "primary": report.plan.primary, "primary_metrics": report.plan.primary_metrics,
                       "problem": report.plan.problem or None,
                       "allow_mixed": report.plan.allow_mixed, "left_out_of_the_verdict": report.plan.excluded,
                       "experiment_configs": [c.to_dict() for c in report.configs]},
        "definitions": {c.key: c.doc for c in (*COLUMNS, *report.extra_columns)}
        | {"steps_to_target": "first step with eval/accuracy >= target; mean over seeds that reached it"},
        "primary_contrasts": [ln.to_dict() for ln in first_screen.primary_lines(report)],
        "algos": algos,
        "not_counted": [{"run": p.name, "algo": p.algo, "strategy": p.strategy, "label": p.label,
                         "status": p.state, "error": p.error} for p in report.problems],
        "plots": {a: {k: p.relative_to(report.sweep_dir).as_posix() for k, p in ps.items()}
                  for a, ps in report.plots.items()},
        "notes": report.notes,
        "frontier": (frontier_report.summary(report.frontier, report.sweep_dir)
                     if report.frontier is not None else None),
        "gao": gao_section.summary(report.gao, report.sweep_dir) if report.gao is not None else None,
    }


def write_all(report) -> None:
    """report.md, report.html and summary.json into the sweep dir, each rendered before the first is written: one
    that cannot be rendered leaves the previous three as they were, none of them stale beside the others."""
    texts = {report.markdown_path: render_markdown(report), report.html_path: render_html(report),
             report.summary_path: json.dumps(summary_dict(report), indent=2, allow_nan=False) + "\n"}
    for path, text in texts.items():
        _write(path, text)
