"""Each algorithm's comparison table: its verdict paragraphs, the flags, the setup block, the target, the table of
every group against the baseline, and the plots. The table is the report's spine (``build.py`` computes it:
``statistics/summary.py``'s ``AlgoTable``, which the first screen and the console read too); this section writes it.
summary.json: ``algos.<algo>``'s numbers, verdicts and setup."""

from __future__ import annotations

from refexp.report.reading.reduce import COLUMNS
from refexp.report.sections.base import AlgorithmSection
from refexp.report.writing.blocks import Image, Lines, Paragraph, table_of
from refexp.report.writing.cells import cell_text
from refexp.report.writing.table import header_and_cells

PLOT_CAPTIONS = {
    "reward": "Reward vs step", "accuracy": "Held-out accuracy vs step",
    "frontier": "Accuracy vs drift from init (kl/init)", "kl_ref": "kl/ref vs step",
    "ref_cost": "Reference cost", "gold": "Gold and proxy reward vs drift from init (kl/init)",
}


def flags(t) -> list[str]:
    """Warnings the table's numbers support, one sentence each: likelihood displacement (``AlgoTable.displaced``)."""
    if not t.displaced:
        return []
    flagged = "; ".join(f"{row.group.label} ({cell_text(row.cells['chosen_delta'])})" for row in t.displaced)
    return ["Likelihood displacement: the chosen completions' log-prob fell below its start in " + flagged
            + " — the margin grew by pushing the chosen answers down too (Pal et al. 2024)."]


def target_line(t) -> str:
    if t.target is None:
        return "No held-out accuracy (`eval/accuracy`) logged: no steps-to-target column."
    return f"Target accuracy T = {t.target:.3g} ({t.target_note})."


def verdict_paragraphs(t, lead: str = "") -> list[Paragraph]:
    """The table's verdict, a paragraph per family (``lead`` before the first)."""
    paragraphs = t.verdict.split("\n\n") if t.verdict else []
    return [Paragraph(p, lead=lead if i == 0 else "") for i, p in enumerate(paragraphs)]


def comparison_dict(c, v, baseline: str, role: str) -> dict:
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


def paired_dict(t, row) -> dict:
    """endpoint key -> the row's comparison with the table's baseline (``comparison_dict``)."""
    return {key: comparison_dict(c, t.verdicts[key].get(row.group.label), t.baseline, t.roles[key][row.group.label])
            for key, c in row.paired.items()}


class ComparisonTable(AlgorithmSection):
    def blocks(self, report, algo: str) -> list:
        t = report.tables[algo]
        out = verdict_paragraphs(t, "Verdict.")
        if flags(t):
            out.append(Lines(tuple(flags(t)), "Flag."))
        out += [table_of(["setup", ""], report.setup.get(algo, []), numeric=False, words=True),
                Paragraph(target_line(t)), table_of(*header_and_cells(t))]
        return out + [Image(path, f"{algo.upper()}: {PLOT_CAPTIONS.get(kind, kind)}")
                      for kind, path in report.plots.get(algo, {}).items()]

    def summary(self, report, algo: str) -> dict:
        t = report.tables[algo]
        groups = []
        for row in t.rows:
            g, reach = row.group, row.to_target
            groups.append({
                "label": g.label, "strategy": g.strategy, "settings": dict(g.settings),
                "runs": [r.name for r in g.runs], "completed_runs": [r.name for r in g.completed],
                "seeds": row.seeds, "n_completed": row.n_completed, "n_total": len(g.runs),
                "metrics": {c.key: (row.cells[c.key].to_dict() if row.cells.get(c.key) else None)
                            for c in (*COLUMNS, *report.extra_columns)},
                "paired_vs_baseline": paired_dict(t, row) or None,
                "steps_to_target": None if reach is None else {
                    "reached": reach.reached, "n_with_eval": reach.n,
                    "estimate": reach.estimate.to_dict() if reach.estimate else None},
            })
        return {"target": t.target, "target_note": t.target_note, "flags": flags(t),
                "columns": [c.key for c in t.columns], "groups": groups,
                "baseline": t.baseline, "headline": t.headline.key if t.headline else None,
                "verdict": t.verdict, "setup": dict(report.setup.get(algo, []))}
