"""From bootstrap distributions to verdicts over a family of comparisons against one baseline.

One rule decides: Holm's step-down over the family's m p-values (each the combined test's: the larger of the
bootstrap's and the Student t's p, ``paired.BothLevelsResult``) says *higher* or *lower* where it rejects at
alpha. The interval printed beside it is the simultaneous (Bonferroni, 1 - alpha/m) one, which covers all m
differences at once; Holm rejects at alpha/(m - i) for the i-th smallest p, so it can reject where that interval
still covers 0, and the verdict then says so. Where Holm does not reject, the verdict is *equivalent within ±m*
when two one-sided tests at alpha/m put the difference inside the declared margin, else *inconclusive*. A
degenerate t (the per-unit differences identical, so the t has no spread) tests nothing: it makes no claim, and
the bootstrap alone does not make one either. An interval reaching beyond what the metric's difference can take
(±1 for a difference of proportions) prints as *uninformative* with its degrees of freedom, not as numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import numpy as np
from scipy.stats import norm
from scipy.stats import t as student_t

from refexp.record.metric_names import EVAL_ACCURACY, EVAL_PASS_AT_K, EVAL_PREF_ACCURACY, EVAL_RETENTION
from refexp.report.statistics.bootstrap import BootstrapResult


@dataclass(frozen=True)
class Holm:
    """Holm-Bonferroni adjusted p-values [m] (input order) and whether each is rejected at ``alpha``."""

    adjusted: np.ndarray
    reject: np.ndarray
    alpha: float


def holm(p_values: Sequence[float], alpha: float = 0.05) -> Holm:
    """Holm's step-down adjustment: sort the m p-values ascending, multiply the i-th (0-based) by m - i,
    carry the running maximum (adjusted p-values are monotone in the raw ones) and cap at 1. A hypothesis
    is rejected when its adjusted p-value is <= alpha, which is the step-down test's decision."""
    p = np.asarray(p_values, dtype=float)
    if p.ndim != 1 or not np.all((p >= 0.0) & (p <= 1.0)):
        raise ValueError(f"p-values must be a 1-d sequence in [0, 1], got {p_values!r}")
    m = len(p)
    order = np.argsort(p, kind="stable")
    stepped = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    adjusted = np.empty(m)
    adjusted[order] = stepped
    return Holm(adjusted, adjusted <= alpha, alpha)


def bonferroni_interval(result: BootstrapResult, alpha: float, family_size: int) -> tuple[float, float]:
    """The (1 - alpha/m) percentile interval: with m intervals, all cover at once with probability >= 1 - alpha.
    It excludes 0 only where the unadjusted p-value is about <= alpha/m, where Holm rejects too."""
    return result.percentile_interval(alpha / family_size)


@dataclass(frozen=True)
class Equivalence:
    """Two one-sided tests that the difference lies inside (-margin, +margin)."""

    margin: float
    alpha: float
    interval: tuple[float, float]
    """The (1 - 2 alpha) percentile interval the decision reads."""
    p_value: float
    """max of the two one-sided bootstrap p-values (difference <= -margin, difference >= +margin)."""
    equivalent: bool


def equivalence(result: BootstrapResult, margin: float, alpha: float = 0.05) -> Equivalence:
    """TOST at ``alpha`` from the bootstrap distribution: equivalent when the (1 - 2 alpha) percentile
    interval lies strictly inside (-margin, +margin)."""
    if margin <= 0:
        raise ValueError(f"margin={margin!r} must be > 0")
    interval = result.percentile_interval(2.0 * alpha)
    p = max(result.tail(-margin, "below"), result.tail(margin, "above"))
    return Equivalence(margin, alpha, interval, p, -margin < interval[0] and interval[1] < margin)


def minimum_detectable_difference(se: float, alpha: float, power: float = 0.8, df: Optional[int] = None) -> float:
    """(q_{1-alpha/2} + q_{power}) * se: the true difference a two-sided test at ``alpha`` detects with
    probability ``power``; q the normal quantile, or Student's t with ``df`` degrees of freedom when the test that
    must reject is a t over few units (two SFT starts: 1 df, where the normal quantiles would claim a detectable
    difference many times too small). The t form is the usual central-t approximation to the noncentral t power
    (Cohen 1988, ch. 2)."""
    if df is None:
        return float((norm.ppf(1.0 - alpha / 2.0) + norm.ppf(power)) * se)
    return float((student_t.ppf(1.0 - alpha / 2.0, df) + student_t.ppf(power, df)) * se)


def students_t_df(result) -> Optional[int]:
    """The degrees of freedom of the Student-t test a result must pass (a seed-only result's, or the t half of a
    both-levels one); None for a bootstrap alone."""
    t_test = getattr(result, "seeds", result)
    df = getattr(t_test, "df", None)
    return int(df) if isinstance(df, (int, float)) and df >= 1 else None


HIGHER, LOWER, INCONCLUSIVE, DEGENERATE = "higher", "lower", "inconclusive", "degenerate t"
"""The verdict words other than ``equivalent within ±m`` (``equivalent_word``)."""

PROPORTIONS = (EVAL_ACCURACY, EVAL_RETENTION, EVAL_PREF_ACCURACY, EVAL_PASS_AT_K)
"""Metrics that are a share of prompts (a mean of per-prompt scores in [0, 1]): a difference of two lies in
[-1, 1]. ``eval/gold`` is not among them: under a gold reward model it is no share."""


def difference_bound(metric: str) -> Optional[float]:
    """The largest |arm - baseline| ``metric`` allows (1 for a share of prompts); None when unknown."""
    return 1.0 if metric in PROPORTIONS else None


def equivalent_word(margin: float) -> str:
    return f"equivalent within ±{margin:g}"


def verdict_word(point: float, p_adjusted: float, alpha: float, equivalent: Optional[Equivalence] = None,
                 degenerate: bool = False) -> str:
    """Holm decides: "higher" / "lower" (the sign of ``point``) where the Holm-adjusted p is <= alpha, else
    "equivalent within ±m" where the two one-sided tests say so, else "inconclusive"; "degenerate t" (no claim)
    whatever the p when the t has no spread."""
    if degenerate:
        return DEGENERATE
    if p_adjusted <= alpha:
        return HIGHER if point > 0 else LOWER
    if equivalent is not None and equivalent.equivalent:
        return equivalent_word(equivalent.margin)
    return INCONCLUSIVE


@dataclass(frozen=True)
class Verdict:
    """One comparison's verdict inside its family, with the numbers its sentence prints."""

    label: str
    word: str
    result: BootstrapResult
    interval: tuple[float, float]
    """The simultaneous (Bonferroni, 1 - alpha/m) percentile interval."""
    p_holm: float
    family_size: int
    alpha: float
    mdd: float
    """Smallest difference detected with probability ``power`` at level alpha/m (Student's t with ``df`` degrees of
    freedom when the comparison must pass a t test, else the normal approximation)."""
    power: float
    equivalence: Optional[Equivalence]
    df: Optional[int] = None
    """The degrees of freedom ``mdd`` was computed with (None: normal approximation)."""
    bound: Optional[float] = None
    """The largest |difference| the metric allows (``difference_bound``); None: unknown."""

    @property
    def level(self) -> float:
        """The simultaneous interval's coverage, 1 - alpha/m."""
        return 1.0 - self.alpha / self.family_size

    @property
    def degenerate(self) -> bool:
        return self.word == DEGENERATE

    @property
    def interval_covers_zero(self) -> bool:
        """Holm rejected while the simultaneous interval still covers 0 (the two disagree)."""
        return self.word in (HIGHER, LOWER) and self.interval[0] <= 0.0 <= self.interval[1]

    def _past_bound(self, interval: tuple[float, float]) -> bool:
        return self.bound is not None and (interval[0] < -self.bound or interval[1] > self.bound)

    def _bounded_text(self, interval: tuple[float, float]) -> str:
        """"[-0.031, +0.105]", or "uninformative (1 df)" when it reaches beyond the metric's range."""
        if self._past_bound(interval):
            return f"uninformative ({self.df} df)" if self.df is not None else "uninformative"
        return f"[{interval[0]:+.3f}, {interval[1]:+.3f}]"

    @property
    def uninformative(self) -> bool:
        """The interval reaches beyond the difference the metric allows (e.g. past ±1 on a share of prompts)."""
        return self._past_bound(self.interval)

    @property
    def interval_text(self) -> str:
        """"[-0.031, +0.105]", or "uninformative (1 df)" when it reaches beyond the metric's range."""
        return self._bounded_text(self.interval)

    @property
    def p_text(self) -> str:
        """The Holm-adjusted p as a table prints it ("—" for a degenerate t, which tests nothing)."""
        return "—" if self.degenerate else f"{self.p_holm:.3g}"

    @property
    def phrase(self) -> str:
        """The verdict as printed: "higher", "higher (Holm; the simultaneous interval covers 0)", "equivalent
        within ±0.05", "inconclusive (interval [-0.031, +0.105])", "inconclusive (uninformative, 1 df)",
        "degenerate t (3 identical per-seed differences): no claim"."""
        if self.interval_covers_zero:
            return f"{self.word} (Holm; the simultaneous interval covers 0)"
        if self.word == INCONCLUSIVE:
            if self.uninformative:
                return f"inconclusive (uninformative{f', {self.df} df' if self.df is not None else ''})"
            return f"inconclusive (interval {self.interval_text})"
        if self.degenerate:
            n, unit = _t_units(self.result)
            return f"degenerate t ({n} identical per-{unit} differences): no claim"
        return self.word

    def sentence(self, baseline: str) -> str:
        """E.g. "ema - fixed: +0.178, simultaneous (Bonferroni) 98.75% interval [+0.012, +0.330], Holm-adjusted p
        0.052 (family of 4 comparisons against fixed, alpha 0.05): inconclusive. ..."."""
        family = (f"family of {self.family_size} comparison{'s' if self.family_size != 1 else ''} against "
                  f"{baseline}, alpha {self.alpha:g}")
        text = (f"{self.label} - {baseline}: {self.result.point:+.3f}, simultaneous (Bonferroni) "
                f"{100 * self.level:.4g}% interval {self.interval_text}, ")
        if self.degenerate:
            n, unit = _t_units(self.result)
            text += (f"no Holm p ({family}): degenerate t: the {n} per-{unit} differences are identical, so the "
                     f"Student-t test has no spread to test against and the bootstrap alone would decide; no "
                     f"claim.")
        else:
            relation = {HIGHER: f"higher than {baseline}", LOWER: f"lower than {baseline}",
                        INCONCLUSIVE: "inconclusive"}.get(self.word, self.word)
            text += f"Holm-adjusted p {self.p_holm:.3g} ({family}): {relation}"
            if self.interval_covers_zero:
                text += (" by Holm's step-down, which decides; the simultaneous interval, which holds for all "
                         f"{self.family_size} at once, still covers 0")
            elif self.uninformative:
                text += (f" (the interval reaches beyond the ±{self.bound:g} this difference can take"
                         f"{f': Student t with {self.df} df' if self.df is not None else ''})")
            text += "."
        if self.equivalence is not None and not self.degenerate:  # a degenerate t decides no equivalence either
            e = self.equivalence
            text += (f" Equivalence margin ±{e.margin:g}: two one-sided tests at {e.alpha:.4g}, "
                     f"{100 * (1 - 2 * e.alpha):.4g}% interval {self._bounded_text(e.interval)}"
                     f"{'' if e.equivalent else ' not inside the margin'}.")
        text += (f" With {_units_text(self.result)}, the smallest difference detected with {self.power:.0%} "
                 f"power at alpha {self.alpha / self.family_size:.4g} is ±{self.mdd:.3f} "
                 f"({'normal approximation' if self.df is None else f'Student t, {self.df} df'}).")
        if self.result.note:
            text += f" Note: {self.result.note}."
        return text


def _t_units(result) -> tuple[int, str]:
    """(how many differences the Student t is over, their unit: "seed" or "start")."""
    t_test = getattr(result, "seeds", result)
    unit = str(getattr(t_test, "unit", "seed")).removeprefix("SFT ")
    return len(getattr(t_test, "diffs", ())), unit


def _units_text(result: BootstrapResult) -> str:
    """E.g. "5 seeds and 200 prompts" (prompts per run when every run has as many)."""
    parts = [f"{n} {lvl}{'s' if n != 1 else ''}" for lvl, n in zip(result.levels[:-1], result.n_units)]
    runs = result.n_units[-2] if len(result.n_units) > 1 else 1
    per_run, prompt = result.n_units[-1] / runs, result.levels[-1]
    if per_run.is_integer():
        parts.append(f"{int(per_run)} {prompt}{'s' if per_run != 1 else ''}")
    else:
        parts.append(f"{result.n_units[-1]} {prompt} outcomes in all")
    return ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]

def family_verdicts(results: Mapping[str, BootstrapResult], *, alpha: float = 0.05,
                    margin: Optional[float] = None, power: float = 0.8,
                    bound: Optional[float] = None, untested: int = 0) -> dict[str, Verdict]:
    """The verdict of each comparison (label -> bootstrap of label - baseline) in one family of m.

    Holm over the m p-values decides (``verdict_word``); a degenerate t (``result.degenerate``) enters with p 1,
    counting in m and rejecting nothing. Simultaneous (Bonferroni, 1 - alpha/m) intervals; with ``margin``, two
    one-sided tests at alpha/m each (so the family's equivalence claims hold together too); the detectable
    difference at alpha/m, the level the interval is read at; ``bound``: the largest |difference| the metric
    allows, beyond which an interval is uninformative; ``untested``: declared comparisons that could not be made
    (no claim), which still count in m with p 1, since the family's alpha was split before the data were seen."""
    m = len(results) + untested
    if not results:
        return {}
    adjusted = holm([r.p_value for r in results.values()] + [1.0] * untested, alpha)
    out = {}
    for (label, r), p_holm in zip(results.items(), adjusted.adjusted):
        interval = bonferroni_interval(r, alpha, m)
        tost = equivalence(r, margin, alpha / m) if margin is not None else None
        df = students_t_df(r)
        word = verdict_word(r.point, float(p_holm), alpha, tost, bool(getattr(r, "degenerate", False)))
        out[label] = Verdict(label, word, r, interval, float(p_holm), m, alpha,
                             minimum_detectable_difference(r.se, alpha / m, power, df), power, tost, df, bound)
    return out
