"""From bootstrap distributions to verdicts over a family of comparisons against one baseline.

Holm's step-down adjustment decides which differences are separated from 0; the intervals printed with
them are Bonferroni's simultaneous (1 - alpha/m) ones, which are never narrower than what Holm decides,
so an interval never shows a separation the adjusted p-value does not. A claim of no difference is made
only with an equivalence margin (two one-sided tests); everything else that includes 0 is "not separated".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import numpy as np
from scipy.stats import norm
from scipy.stats import t as student_t

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


def verdict_word(interval: tuple[float, float], p_adjusted: float, alpha: float,
                 equivalent: Optional[Equivalence] = None) -> str:
    """"higher" / "lower" when the adjusted p-value is <= alpha and the adjusted interval lies on one side
    of 0 (both, so that the printed interval and p-value never disagree), else "equivalent within ±m"
    when the two one-sided tests say so, else "not separated"."""
    lo, hi = interval
    if p_adjusted <= alpha and lo > 0:
        return "higher"
    if p_adjusted <= alpha and hi < 0:
        return "lower"
    if equivalent is not None and equivalent.equivalent:
        return f"equivalent within ±{equivalent.margin:g}"
    return "not separated"


@dataclass(frozen=True)
class Verdict:
    """One comparison's verdict inside its family, with the numbers its sentence prints."""

    label: str
    word: str
    result: BootstrapResult
    interval: tuple[float, float]
    """Bonferroni-adjusted (1 - alpha/m) percentile interval."""
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

    def sentence(self, baseline: str) -> str:
        """E.g. "ema - fixed: +0.178, Bonferroni 98.75% interval [+0.012, +0.330], Holm-adjusted p 0.052
        (family of 4 comparisons against fixed, alpha 0.05): not separated. ..."."""
        lo, hi = self.interval
        level = 100.0 * (1.0 - self.alpha / self.family_size)
        relation = {"higher": f"higher than {baseline}", "lower": f"lower than {baseline}",
                    "not separated": f"not separated from {baseline}"}.get(self.word, self.word)
        text = (f"{self.label} - {baseline}: {self.result.point:+.3f}, Bonferroni {level:.4g}% interval "
                f"[{lo:+.3f}, {hi:+.3f}], Holm-adjusted p {self.p_holm:.3g} (family of {self.family_size} "
                f"comparison{'s' if self.family_size != 1 else ''} against {baseline}, alpha {self.alpha:g}): "
                f"{relation}.")
        if self.equivalence is not None:
            e = self.equivalence
            text += (f" Equivalence margin ±{e.margin:g}: two one-sided tests at {e.alpha:.4g}, "
                     f"{100 * (1 - 2 * e.alpha):.4g}% interval [{e.interval[0]:+.3f}, {e.interval[1]:+.3f}]"
                     f"{'' if e.equivalent else ' not inside the margin'}.")
        text += (f" With {_units_text(self.result)}, the smallest difference detected with {self.power:.0%} "
                 f"power at alpha {self.alpha / self.family_size:.4g} is ±{self.mdd:.3f} "
                 f"({'normal approximation' if self.df is None else f'Student t, {self.df} df'}).")
        if self.result.note:
            text += f" Note: {self.result.note}."
        return text


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
                    margin: Optional[float] = None, power: float = 0.8) -> dict[str, Verdict]:
    """The verdict of each comparison (label -> bootstrap of label - baseline) in one family of m.

    Holm over the m bootstrap p-values; Bonferroni (1 - alpha/m) intervals; with ``margin``, two one-sided
    tests at alpha/m each (so the family's equivalence claims hold together too); the detectable
    difference at alpha/m, the level the interval is read at."""
    m = len(results)
    if m == 0:
        return {}
    adjusted = holm([r.p_value for r in results.values()], alpha)
    out = {}
    for (label, r), p_holm in zip(results.items(), adjusted.adjusted):
        interval = bonferroni_interval(r, alpha, m)
        tost = equivalence(r, margin, alpha / m) if margin is not None else None
        df = students_t_df(r)
        out[label] = Verdict(label, verdict_word(interval, float(p_holm), alpha, tost), r, interval,
                             float(p_holm), m, alpha, minimum_detectable_difference(r.se, alpha / m, power, df),
                             power, tost, df)
    return out
