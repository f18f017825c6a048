"""Paired differences against the baseline group, and the verdict sentences they support.

Every arm of a sweep starts from an SFT checkpoint (its start), a seed fixes the batch order and the sampling noise,
and every run is evaluated on the same held-out prompts, so arm - baseline is paired by (start, seed) and by
prompt. The difference comes from ``bootstrap.paired_hierarchical_bootstrap`` on the per-prompt outcomes
(``eval_outcomes.jsonl``): seeds, then prompts, one prompt draw per replicate serving both arms of every pair
when all the runs were scored on the same prompts (crossed with the seeds: ``crossed``), else each run's own. Runs
written before that file existed fall back to the Student-t interval over the per-seed differences, labelled
"seed-only" (it leaves out the prompts' noise). Verdicts are made over the family of comparisons against the
baseline (``inference.family_verdicts``: Holm's step-down decides, beside simultaneous Bonferroni intervals; TOST at
the equivalence margin; no claim where the t is degenerate).

Several SFT starts (``sft.seed=0,1``): the seeds are nested in the starts, and a difference that one start's seeds
agree on may reverse on another start, so the start, not the seed, is the independent unit (pseudoreplication:
Hurlbert 1984, Ecol. Monogr. 54:187; Lazic 2010, BMC Neurosci. 11:5). The bootstrap then resamples starts, then
seeds within start, then prompts; its Student-t companion is taken over the per-start mean differences (n starts,
n - 1 degrees of freedom), which in a balanced design is the exact test of the mean difference under the nested
random-effects model (the start-by-arm interaction is its error term), and with unequal seeds per start weighs each
start alike, as the bootstrap's hierarchical mean does. One start is exactly the one-start analysis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

from refexp.report.reading.group import Group
from refexp.report.reading.load import Run, natural_key
from refexp.report.reading.reduce import ACC
from refexp.report.statistics.bootstrap import BootstrapResult, paired_hierarchical_bootstrap
from refexp.report.statistics.inference import Verdict, family_verdicts
from refexp.report.statistics.stats import Estimate, mean_ci, t_cdf, t_quantile

N_BOOT = 10000
"""Bootstrap replicates per comparison (seeded: a report is reproducible)."""
SEED_ONLY_NOTE = "seed-only: the prompts' noise is not included"
START_LEVEL = "SFT start"
"""The name of the level above the seeds when a comparison spans several SFT starts."""
DEGENERATE_SPREAD = 1e-9
"""Per-unit differences that agree to within this are identical: a t over them has no spread to test against.
Differences of accuracies on a 1/P grid (P prompts) that are equal on the grid differ by float rounding only
(~1e-16), far below any grid step."""


@dataclass(frozen=True)
class Endpoint:
    """A number a verdict is about: the per-run value (the seed-only fallback) and the evaluation step whose
    per-prompt outcomes give it (None: the run has none)."""

    key: str
    header: str
    doc_name: str
    per_run: Callable[[Run], Optional[float]]
    outcome_step: Callable[[Run], Optional[int]]
    metric: str = ACC
    """The metric whose per-prompt outcomes the bootstrap resamples (``eval/accuracy``, ``eval/retention``)."""


def final_step(run: Run, metric: str = ACC) -> Optional[int]:
    """The run's last evaluation with outcomes of ``metric``, when it is the last value of it logged too."""
    steps, _ = run.series(metric)
    last = max(run.outcomes_of(metric), default=None)
    return last if last is not None and len(steps) and last == int(steps[-1]) else None


def step_at(run: Run, step: int, metric: str = ACC) -> Optional[int]:
    """The run's last evaluation with outcomes of ``metric`` at or before ``step`` (None when it stopped before
    ``step``)."""
    outcomes = run.outcomes_of(metric)
    if not outcomes or max(outcomes) < step:
        return None
    before = [s for s in outcomes if s <= step]
    return max(before) if before else None


def prompt_pair(arm: Run, base: Run, endpoint: Endpoint) -> Optional[tuple[list[float], list[float], list[int]]]:
    """(arm's scores, baseline's scores, their prompt ids) over the prompts both evaluations scored, in the arm's
    order."""
    sa, sb = endpoint.outcome_step(arm), endpoint.outcome_step(base)
    if sa is None or sb is None:
        return None
    a, b = arm.outcomes_of(endpoint.metric)[sa], base.outcomes_of(endpoint.metric)[sb]
    ids = [i for i in a if i in b]
    return ([a[i] for i in ids], [b[i] for i in ids], ids) if ids else None


@dataclass(frozen=True)
class SeedOnlyResult:
    """The fallback without per-prompt outcomes: Student-t over the per-seed differences (n >= 2); with several
    SFT starts (``unit`` ``START_LEVEL``), over the per-start mean differences. It answers what ``BootstrapResult``
    answers (point, p_value, se, percentile_interval, tail, levels, note), so the family's Holm adjustment and
    verdict words treat both alike."""

    diffs: tuple[float, ...]
    unit: str = "seed"
    """What one of ``diffs`` is the difference of: a seed, or an SFT start (the mean over its seeds)."""

    @property
    def point(self) -> float:
        return float(sum(self.diffs) / len(self.diffs))

    @property
    def se(self) -> float:
        est = mean_ci(self.diffs)
        return est.std / math.sqrt(est.n)

    @property
    def df(self) -> int:
        return len(self.diffs) - 1

    note = SEED_ONLY_NOTE

    @property
    def levels(self) -> tuple[str]:
        return (self.unit,)

    @property
    def resampled(self) -> tuple[str]:
        return (self.unit,)

    @property
    def n_units(self) -> tuple[int]:
        return (len(self.diffs),)

    @property
    def over(self) -> str:
        """What the t is taken over, in the report's words."""
        if self.unit == "seed":
            return "the per-seed differences"
        return f"the per-{self.unit.removeprefix('SFT ')} mean differences (each {self.unit}'s mean over its seeds)"

    @property
    def method(self) -> str:
        return f"seed-only Student-t interval over {self.over} (no per-prompt outcomes)"

    @property
    def degenerate(self) -> bool:
        """Two or more differences, all identical (to ``DEGENERATE_SPREAD``): e.g. 3 seeds whose accuracies on
        200 prompts differ by +0.060 each. The t's standard error is then 0, its statistic infinite or 0/0, so
        it tests nothing; its p-value is 1 (no evidence), and ``inference.verdict_word`` makes no claim."""
        return len(self.diffs) >= 2 and max(self.diffs) - min(self.diffs) <= DEGENERATE_SPREAD

    def tail(self, threshold: float, side: str) -> float:
        """P(point + se·T <= threshold) ("below") or >= ("above"), T Student's t with n-1 df."""
        if self.se == 0:
            below = 1.0 if self.point <= threshold else 0.0
            above = 1.0 if self.point >= threshold else 0.0
            return below if side == "below" else above
        p = t_cdf((threshold - self.point) / self.se, self.df)
        return p if side == "below" else 1.0 - p

    @property
    def p_value(self) -> float:
        """Two-sided; 1 for a degenerate t (``degenerate``), which tests nothing."""
        if self.degenerate:
            return 1.0
        return min(1.0, 2.0 * min(self.tail(0.0, "below"), self.tail(0.0, "above")))

    def percentile_interval(self, alpha: float) -> tuple[float, float]:
        """The (1 - alpha) t interval (named as the bootstrap's, whose place it takes)."""
        half = t_quantile(1.0 - alpha / 2.0, self.df) * self.se
        return self.point - half, self.point + half


@dataclass(frozen=True)
class BothLevelsResult:
    """A difference that must clear two tests: the hierarchical bootstrap (the prompts' noise, which a seed-level
    test leaves out) and the Student-t test over the per-seed differences (the few seeds' own uncertainty: a
    percentile bootstrap of 3 top-level units is far narrower than t with 2 degrees of freedom). A direction is
    claimed only where both reject (p = the larger p; interval = the hull of the two), a conservative test, and
    never where the t is degenerate (``SeedOnlyResult.degenerate``: p 1)."""

    boot: BootstrapResult
    seeds: SeedOnlyResult

    def __getattr__(self, name):  # levels, n_units, resampled, replicates, ... : the bootstrap's
        return getattr(self.boot, name)

    @property
    def point(self) -> float:
        return self.boot.point

    @property
    def se(self) -> float:
        return max(self.boot.se, self.seeds.se)

    @property
    def p_value(self) -> float:
        return max(self.boot.p_value, self.seeds.p_value)

    @property
    def note(self) -> Optional[str]:
        return self.boot.note

    @property
    def degenerate(self) -> bool:
        """The t has no spread (``SeedOnlyResult.degenerate``): the bootstrap alone would decide, so no claim."""
        return self.seeds.degenerate

    @property
    def method(self) -> str:
        return (f"{self.boot.method}, and a Student-t test over {self.seeds.over}; a difference counts only "
                f"where both tests reject (the larger p, the hull of the two intervals; no claim where the t is "
                f"degenerate)")

    def percentile_interval(self, alpha: float) -> tuple[float, float]:
        (a, b), (c, d) = self.boot.percentile_interval(alpha), self.seeds.percentile_interval(alpha)
        return min(a, c), max(b, d)

    def tail(self, threshold: float, side: str) -> float:
        return max(self.boot.tail(threshold, side), self.seeds.tail(threshold, side))


@dataclass
class Comparison:
    """One group against the baseline on one endpoint, over the seeds both completed (and the plan counts)."""

    label: str
    seeds: list[int]
    result: Optional[BothLevelsResult | SeedOnlyResult]
    seed_t: Optional[Estimate]
    """The Student-t 95% interval over the per-seed differences (the seed-only column); with several SFT starts,
    over the per-start mean differences."""
    no_claim: str = ""
    """Why there is no result (no common seed; one seed without per-prompt outcomes)."""
    starts: list[str] = field(default_factory=list)
    """The SFT start of each pair, aligned with ``seeds`` (``Run.sft_start``)."""

    @property
    def seed_only(self) -> bool:
        return isinstance(self.result, SeedOnlyResult)

    @property
    def seeds_per_start(self) -> dict[str, int]:
        """start -> how many paired seeds it holds, in the pairs' order."""
        out: dict[str, int] = {}
        for s in self.starts:
            out[s] = out.get(s, 0) + 1
        return out


Unit = tuple[str, int]
"""(SFT start, seed): the replicate a pair of runs (or one run's two evaluations) shares."""
Leaf = Optional[tuple[Sequence[float], Sequence[float], Sequence[int]]]
"""(arm's per-prompt scores [P], baseline's [P], the prompt ids [P] they are scores of) over the prompts both scored;
None without per-prompt outcomes."""


def crossed(leaves: Sequence[Leaf]) -> Optional[list[tuple[np.ndarray, np.ndarray]]]:
    """Every leaf's (arm, baseline) scores in ascending prompt-id order when all of ``leaves`` are over the same
    prompt ids (every run of a sweep scored on the same test prompts: the prompts are crossed with the starts and
    seeds); None when some leaf is missing or the leaves' prompts differ (then they are nested in the runs)."""
    if not leaves or any(leaf is None for leaf in leaves):
        return None
    order = [np.argsort(np.asarray(ids), kind="stable") for _, _, ids in leaves]
    first = np.asarray(leaves[0][2])[order[0]]
    if any(len(ids) != len(first) or not np.array_equal(np.asarray(ids)[o], first)
           for (_, _, ids), o in zip(leaves, order)):
        return None
    return [(np.asarray(a, dtype=float)[o], np.asarray(b, dtype=float)[o]) for (a, b, _), o in zip(leaves, order)]


def unit_result(units: dict[Unit, tuple[Leaf, float]]
                ) -> tuple[Optional[BothLevelsResult | SeedOnlyResult], Optional[Estimate], str]:
    """(result, the seed-only t estimate, why no result) of paired differences over ``units``: (start, seed) ->
    (the prompt pair, arm - baseline). One start: seeds, then prompts, and the t over the per-seed differences;
    several: starts, then seeds within start, then prompts, and the t over the per-start mean differences (module
    doc). Units scored on the same prompts (every run of a sweep) share one prompt draw per replicate (``crossed``);
    otherwise each run's prompts are drawn within it. Without every unit's prompt pair, the t alone."""
    keys = sorted(units, key=lambda u: (natural_key(u[0]), u[1]))
    leaves = [units[k][0] for k in keys]
    pairs = crossed(leaves)
    shared = pairs is not None
    if not shared:
        pairs = [None if leaf is None else (leaf[0], leaf[1]) for leaf in leaves]
    by_start: dict[str, dict[int, tuple[Optional[tuple], float]]] = {}
    for (start, seed), pair in zip(keys, pairs):
        by_start.setdefault(start, {})[seed] = (pair, units[(start, seed)][1])
    if not by_start:
        return None, None, "no common seed"
    if len(by_start) == 1:
        (seeds,) = by_start.values()
        diffs = [d for _, d in seeds.values()]
        seed_t = mean_ci(diffs)
        if len(diffs) < 2:  # the seed-to-seed spread is unknown: no test of a sweep's question
            return None, seed_t, "one paired seed"
        t_test, tree = SeedOnlyResult(tuple(diffs)), {seed: pair for seed, (pair, _) in seeds.items()}
        levels = ("seed", "prompt")
    else:
        start_means = tuple(sum(d for _, d in seeds.values()) / len(seeds) for seeds in by_start.values())
        seed_t, t_test = mean_ci(start_means), SeedOnlyResult(start_means, unit=START_LEVEL)
        if all(len(seeds) == 1 for seeds in by_start.values()):  # a start is one run: starts, then prompts
            tree = {s: next(iter(seeds.values()))[0] for s, seeds in by_start.items()}
            levels = (START_LEVEL, "prompt")
        else:
            tree = {s: {seed: pair for seed, (pair, _) in seeds.items()} for s, seeds in by_start.items()}
            levels = (START_LEVEL, "seed", "prompt")
    if all(pair is not None for pair in pairs):
        # Shared prompts: one prompt draw per replicate serves every run (bootstrap.py), so a prompt x arm effect
        # common to the seeds is resampled once per replicate, not averaged away across the seeds.
        boot = paired_hierarchical_bootstrap(tree, levels=levels, n_boot=N_BOOT, shared_prompts=shared)
        return BothLevelsResult(boot, t_test), seed_t, ""
    return t_test, seed_t, ""


def compare(group: Group, base: Group, endpoint: Endpoint, counts: Callable[[Run], bool]) -> Comparison:
    """``group - base`` on ``endpoint`` over the (SFT start, seed) pairs both completed among the runs ``counts``
    admits (``unit_result``)."""
    base_runs = {(r.sft_start, r.seed): r for r in base.completed if r.seed is not None and counts(r)}
    pairs = [(r, base_runs[(r.sft_start, r.seed)]) for r in group.completed
             if (r.sft_start, r.seed) in base_runs and counts(r)]
    pairs = [(a, b) for a, b in pairs if endpoint.per_run(a) is not None and endpoint.per_run(b) is not None]
    pairs.sort(key=lambda p: (natural_key(p[0].sft_start), p[0].seed))
    seeds, starts = [a.seed for a, _ in pairs], [a.sft_start for a, _ in pairs]
    units = {(a.sft_start, a.seed): (prompt_pair(a, b, endpoint), endpoint.per_run(a) - endpoint.per_run(b))
             for a, b in pairs}
    result, seed_t, no_claim = unit_result(units)
    return Comparison(group.label, seeds, result, seed_t, no_claim, starts)


def design_text(c: Comparison) -> str:
    """E.g. "2 SFT starts × 3 seeds" (or "× 2–3 seeds" when the starts hold different numbers of paired seeds)."""
    counts = list(c.seeds_per_start.values())
    if not counts:
        return "no pair"
    lo, hi = min(counts), max(counts)
    n = f"{lo}" if lo == hi else f"{lo}–{hi}"
    return f"{len(counts)} SFT start{'s' if len(counts) != 1 else ''} × {n} seed{'s' if hi != 1 else ''}"


def judge(comparisons: list[Comparison], alpha: float, margin: Optional[float],
          bound: Optional[float] = None) -> dict[str, Verdict]:
    """The verdict of every comparison with a result, Holm-adjusted over them as one family (``bound``: the
    largest |difference| the endpoint's metric allows, ``inference.difference_bound``)."""
    return family_verdicts({c.label: c.result for c in comparisons if c.result is not None}, alpha=alpha,
                           margin=margin, bound=bound)


def verdict_text(algo: str, endpoint: Endpoint, baseline: str, kind: str, comparisons: list[Comparison],
                 verdicts: dict[str, Verdict], alpha: float) -> str:
    """The verdict paragraph: what is compared and how (the family, the method), then one sentence per
    comparison (``Verdict.sentence``) and the comparisons without a claim."""
    m = len(verdicts)
    methods = list(dict.fromkeys(c.result.method for c in comparisons if c.result is not None))
    designs = list(dict.fromkeys(design_text(c) for c in comparisons if c.starts))
    design = (f" Runs paired by SFT start and seed: {designs[0]}." if len(designs) == 1 else
              " Runs paired by SFT start and seed: " + "; ".join(f"{c.label} {design_text(c)}" for c in comparisons
                                                                 if c.starts) + "." if designs else "")
    head = (f"{algo.upper()}, {endpoint.doc_name}, paired against {baseline} ({kind}).{design} Family: {m} "
            f"comparison{'s' if m != 1 else ''} against {baseline}, Holm-adjusted, alpha {alpha:g}. Method: "
            f"{'; '.join(methods) or 'none'}.")
    parts = [head] + [verdicts[c.label].sentence(baseline) for c in comparisons if c.label in verdicts]
    unclaimed = [f"{c.label} ({c.no_claim})" for c in comparisons if c.result is None]
    if unclaimed:
        parts.append("No claim: " + "; ".join(unclaimed) + ".")
    return " ".join(parts)
