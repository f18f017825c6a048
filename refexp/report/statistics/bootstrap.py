"""Paired hierarchical percentile bootstrap of a difference of mean per-prompt scores, arm - baseline.

Every run of a sweep is evaluated on the same held-out prompts, and two arms share a seed's randomness,
so the difference is paired twice: by seed and by prompt. Each replicate resamples the outermost units
(seeds) with replacement, then within each drawn unit its sub-units, down to the prompts, where the same
prompt indices are drawn for both arms (so only the per-prompt differences matter). The prompts are crossed
with the seeds, not nested in them: one sample of the task's problems scores every run, so a prompt on which
the arm beats the baseline in every seed is one draw of that sample, not one per seed. With ``shared_prompts``
(what the report uses whenever its runs were scored on the same prompts, ``paired.unit_result``) one prompt
draw per replicate serves every run: the two-way "pigeonhole" bootstrap of a crossed design (Owen 2007, Ann.
Appl. Stat. 1:386), which resamples seeds and prompts independently and errs wide, never narrow (it counts the
seed x prompt noise in both margins). Drawing prompts afresh in each run instead treats a prompt effect common
to the seeds as independent across them and shrinks it by up to sqrt(seeds) (tests/test_inference.py
simulates the design and measures both). ``scipy.stats.bootstrap`` resamples one level only, hence this module.
The levels are generic (e.g. SFT start -> seed -> prompt).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence, Union

import numpy as np

Scores = Sequence[float]
Tree = Union[Mapping[object, "Tree"], tuple[Scores, Scores]]
"""Outermost level first: a mapping per level (e.g. seed -> ...), and at the bottom a pair
(arm's scores[P], baseline's scores[P]) over the same prompt ids in the same order."""

_LEAF_DRAWS = 2_000_000
"""Prompt indices drawn at once at the bottom level (16 MB of int64); larger draws go in chunks."""


@dataclass(frozen=True)
class BootstrapResult:
    """The bootstrap distribution of mean(arm) - mean(baseline) and what the report prints from it.

    ``point`` is the hierarchical mean: the mean over outermost units of the mean over their sub-units,
    down to the mean over prompts of arm - baseline (with as many prompts in every run, the plain mean)."""

    point: float
    interval: tuple[float, float]
    """Percentile interval at level 1 - alpha."""
    alpha: float
    p_value: float
    """Two-sided: 2 * min((1 + #{rep <= 0}) / (B + 1), (1 + #{rep >= 0}) / (B + 1)), capped at 1."""
    se: float
    """Standard deviation of the replicates (ddof=1; 0 for one replicate)."""
    levels: tuple[str, ...]
    """Level names, outermost first, the prompts last (e.g. ("seed", "prompt"))."""
    n_units: tuple[int, ...]
    """Units at each level, summed over their parents (e.g. (5, 1000): 5 seeds, 200 prompts each)."""
    resampled: tuple[str, ...]
    """The levels that had more than one unit under some parent, so resampling them could vary the mean."""
    n_boot: int
    replicates: np.ndarray = field(repr=False, compare=False)
    """The B replicate differences, shape [B]."""
    shared_prompts: bool = False
    """One prompt draw per replicate served every run (prompts crossed with seeds, not nested in them)."""
    x_noise_share: Optional[float] = None
    """The share of the replicates' variance due to the matched x's own measurement noise, where a matched-drift
    comparison resampled it (``drift_resample.shifted``); None otherwise."""

    @property
    def method(self) -> str:
        """How the interval was made, in the words the report prints."""
        method = describe_method(self.levels, self.resampled, self.n_boot)
        return method + ("; one prompt draw per replicate for every run" if self.shared_prompts else "")

    @property
    def note(self) -> Optional[str]:
        """What the interval leaves out, when a level had a single unit (e.g. one seed); else None."""
        missing = [lvl for lvl in self.levels if lvl not in self.resampled]
        if not missing:
            return None
        return "; ".join(f"one {m} only: not resampled, so the interval leaves out {m}-to-{m} spread"
                         for m in missing)

    @classmethod
    def from_replicates(cls, replicates: np.ndarray, point: float, *, alpha: float, levels: Sequence[str],
                        n_units: Sequence[int], resampled: Sequence[str], shared_prompts: bool = False
                        ) -> "BootstrapResult":
        """Summarise B replicate differences [B] of an estimate ``point``: interval, p-value, se."""
        reps = np.asarray(replicates, dtype=float)
        below, above = share_beyond(reps, 0.0, "below"), share_beyond(reps, 0.0, "above")
        return cls(point=float(point), interval=percentile_interval(reps, alpha), alpha=alpha,
                   p_value=min(1.0, 2.0 * min(below, above)),
                   se=float(np.std(reps, ddof=1)) if len(reps) > 1 else 0.0, levels=tuple(levels),
                   n_units=tuple(n_units), resampled=tuple(resampled), n_boot=len(reps), replicates=reps,
                   shared_prompts=shared_prompts)

    def percentile_interval(self, alpha: float) -> tuple[float, float]:
        """The (1 - alpha) percentile interval of the replicates (e.g. alpha / m for a Bonferroni family)."""
        return percentile_interval(self.replicates, alpha)

    def tail(self, threshold: float, side: str) -> float:
        """The one-sided p-value of "the difference lies beyond ``threshold``" on ``side`` ("below"/"above"),
        read from the replicates (``share_beyond``)."""
        return share_beyond(self.replicates, threshold, side)


def describe_method(levels: Sequence[str], resampled: Sequence[str], n_boot: int) -> str:
    """E.g. "paired hierarchical percentile bootstrap: seeds, then prompts within seed; B=10000"."""
    kept = [lvl for lvl in levels if lvl in resampled]
    if len(kept) <= 1:
        what = f"{kept[0]}s" if kept else "nothing (every level has one unit)"
        return f"paired percentile bootstrap over {what}; B={n_boot}"
    steps = [f"{kept[0]}s"] + [f"{child}s within {parent}" for parent, child in zip(kept, kept[1:])]
    return f"paired hierarchical percentile bootstrap: {', then '.join(steps)}; B={n_boot}"


def percentile_interval(replicates: np.ndarray, alpha: float) -> tuple[float, float]:
    """The (alpha/2, 1 - alpha/2) quantiles of ``replicates`` [B]; both equal the value when all are equal."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha={alpha!r} must lie in (0, 1)")
    lo, hi = np.quantile(replicates, [alpha / 2.0, 1.0 - alpha / 2.0])
    return float(lo), float(hi)


def share_beyond(replicates: np.ndarray, threshold: float, side: str) -> float:
    """(1 + #{rep <= threshold}) / (B + 1) for side "below", (1 + #{rep >= threshold}) / (B + 1) for "above":
    a one-sided bootstrap p-value, never 0 (the +1 counts the observed sample as one of the replicates)."""
    count = np.count_nonzero(replicates <= threshold if side == "below" else replicates >= threshold)
    return float((1 + count) / (len(replicates) + 1))


def _check_tree(tree: Tree, depth: int) -> None:
    """Raise ValueError unless ``tree`` has mappings for ``depth`` levels and paired finite scores below."""
    if depth > 0:
        if not isinstance(tree, Mapping) or not tree:
            raise ValueError(f"expected a non-empty mapping {depth} level(s) above the prompts, got {type(tree)}")
        for child in tree.values():
            _check_tree(child, depth - 1)
        return
    if isinstance(tree, Mapping) or len(tree) != 2:
        raise ValueError("expected (arm's scores, baseline's scores) at the prompt level")
    a, b = (np.asarray(x, dtype=float) for x in tree)
    if a.ndim != 1 or a.shape != b.shape or a.size == 0:
        raise ValueError(f"the arms' scores must be two non-empty 1-d arrays over the same prompts, got "
                         f"shapes {a.shape} and {b.shape}")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("a score is NaN or infinite")


def _differences(tree: Tree, depth: int):
    """The same tree with each leaf replaced by arm - baseline per prompt, and lists for children."""
    if depth == 0:
        a, b = (np.asarray(x, dtype=float) for x in tree)
        return a - b
    return [_differences(child, depth - 1) for child in tree.values()]


def _hierarchical_mean(node) -> float:
    if isinstance(node, np.ndarray):
        return float(node.mean())
    return float(np.mean([_hierarchical_mean(child) for child in node]))


def _units(node, depth: int, counts: list[int], varies: list[bool]) -> None:
    """Add each level's unit count to ``counts``; mark ``varies`` where some parent has more than one."""
    n = len(node)
    counts[depth] += n
    varies[depth] |= n > 1
    if not isinstance(node, np.ndarray):
        for child in node:
            _units(child, depth + 1, counts, varies)


def _replicate_means(node, reps: np.ndarray, rng: np.random.Generator,
                     shared_prompts: Optional[np.ndarray]) -> np.ndarray:
    """One bootstrap mean of ``node`` per slot; ``reps`` [k] names each slot's replicate.

    A node with n children draws n children with replacement per slot and recurses once per child over
    all the slots that drew it (vectorised per level). At the prompts, ``shared_prompts`` [B, P] gives
    every unit of a replicate the same prompt draw; None draws them afresh per slot."""
    k = len(reps)
    if isinstance(node, np.ndarray):
        out = np.empty(k)
        chunk = max(1, _LEAF_DRAWS // len(node))
        for start in range(0, k, chunk):
            rows = reps[start:start + chunk]
            idx = (shared_prompts[rows] if shared_prompts is not None
                   else rng.integers(0, len(node), size=(len(rows), len(node))))
            out[start:start + chunk] = node[idx].mean(axis=1)
        return out
    n = len(node)
    draws = rng.integers(0, n, size=(k, n))
    values = np.empty((k, n))
    for j, child in enumerate(node):
        slot, pos = np.nonzero(draws == j)
        if len(slot):
            values[slot, pos] = _replicate_means(child, reps[slot], rng, shared_prompts)
    return values.mean(axis=1)


def paired_hierarchical_bootstrap(tree: Tree, *, levels: Sequence[str] = ("seed", "prompt"),
                                  n_boot: int = 10000, seed: int = 0, alpha: float = 0.05,
                                  shared_prompts: bool = False) -> BootstrapResult:
    """Bootstrap mean(arm) - mean(baseline) over ``tree`` (``{seed: (arm[P], baseline[P])}`` for the
    default levels; ``{start: {seed: (arm, baseline)}}`` with levels ("SFT start", "seed", "prompt")).

    Each of ``n_boot`` replicates resamples the outermost units with replacement, then within each drawn
    unit its sub-units, then the prompts, the same prompt indices for both arms. With ``shared_prompts``
    (runs scored on the same prompts; all runs must hold them in the same order) one prompt draw per replicate
    serves every run: the prompts are a sample crossed with the seeds, whose noise does not shrink with more
    seeds (module doc; tests/test_inference.py measures the interval's coverage in that design with 3 seeds).
    Without it each run's prompts are drawn afresh (prompts nested in runs), right only for runs scored on
    different prompts. A level with one unit (one seed) is kept as is; ``BootstrapResult.note`` says so.
    Resampling prompts inside each drawn seed counts a run's own prompt noise twice (it is already in the
    spread of the seed means), so where that noise dominates the interval errs wide.
    Degenerate data (all differences equal) give an interval collapsed onto the point, se 0, and p 1
    when that point is 0.
    """
    if n_boot < 1:
        raise ValueError(f"n_boot={n_boot!r} must be >= 1")
    depth = len(levels) - 1
    if depth < 0:
        raise ValueError("levels must name at least the prompt level")
    _check_tree(tree, depth)
    # prompts alone (depth 0) are wrapped in a one-unit level, which resampling leaves unchanged
    wrapped = depth == 0
    root = [_differences(tree, 0)] if wrapped else _differences(tree, depth)
    rng = np.random.default_rng(seed)
    shared = None
    if shared_prompts:
        sizes = sorted({len(leaf) for leaf in _leaves(root)})
        if len(sizes) != 1:
            raise ValueError(f"shared_prompts needs the same prompts in every run, got counts {sizes}")
        shared = rng.integers(0, sizes[0], size=(n_boot, sizes[0]))
    reps = _replicate_means(root, np.arange(n_boot), rng, shared)
    counts, varies = [0] * (depth + 1 + wrapped), [False] * (depth + 1 + wrapped)
    _units(root, 0, counts, varies)
    counts, varies = counts[wrapped:], varies[wrapped:]
    return BootstrapResult.from_replicates(
        reps, _hierarchical_mean(root), alpha=alpha, levels=levels, n_units=counts,
        resampled=[lvl for lvl, v in zip(levels, varies) if v], shared_prompts=shared_prompts)


def _leaves(node):
    """The per-prompt difference arrays of a tree of lists, depth first."""
    if isinstance(node, np.ndarray):
        yield node
    else:
        for child in node:
            yield from _leaves(child)
