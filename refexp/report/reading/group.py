"""Group runs that differ only by seed, and name each group for a table row or a legend.

A group is (algorithm, strategy, the other swept settings). The swept settings are the job's
``.hydra/overrides.yaml`` minus the seed and Hydra's own keys, so a sweep over
``reference=periodic_reset reference.reset_every=20,50 training.seed=0,1,2`` gives one group per
reset_every with three seeds each (a strategy's own fields can only be set for that strategy).

A group's identity does not depend on how a number was spelled: ``training.lr=1e-3`` (a sweep job rerun by hand)
and ``training.lr=0.001`` (the job as its sweeper wrote it) are one group (``record/overrides.py``'s
``normalised_value``), and so are ``algo.beta=1`` and ``algo.beta=1.0``; the label spells it as the first run did.

A setting the algorithm does not read for a strategy (``UNREAD_SETTINGS``: GRPO's β without a reference) does
not tell groups apart: ``none`` swept over four β is one configuration run four times, so it is one group, and
of the runs that repeat one (SFT start, seed) the first is counted and the others are listed as repeats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from refexp.choices import REFERENCE_STRATEGIES
from refexp.record.overrides import spelled_number, swept_settings
from refexp.report.reading.load import Run, natural_key

ALGO_ORDER = ("grpo", "dpo", "sft")

UNREAD_SETTINGS = {("grpo", "none"): ("algo.beta",)}
"""(algo, strategy) -> swept settings that algorithm does not read with that strategy: GRPO's loss has no KL term
without a reference, so β multiplies nothing (``refexp/algos/grpo.py``; the issue-38 audit found the four ``none``
runs per seed of ``frontier_grpo`` bit-identical). DPO's reference-free losses (SimPO, ORPO) do read β: not listed."""


@dataclass
class Group:
    """Runs of one algorithm and strategy that share every swept setting except the seed."""

    algo: str
    strategy: str
    settings: tuple[tuple[str, str], ...]
    runs: list[Run] = field(default_factory=list)
    label: str = ""
    repeats: list[Run] = field(default_factory=list)
    """Runs of the same configuration as one of ``runs`` (same SFT start and seed, differing only in a setting of
    ``UNREAD_SETTINGS``): not counted again."""
    unread: dict[str, list[str]] = field(default_factory=dict)
    """Setting of ``UNREAD_SETTINGS`` -> the values this group's runs were swept over (several: merged)."""

    @property
    def completed(self) -> list[Run]:
        """The runs whose numbers count (status completed and metrics present)."""
        return [r for r in self.runs if r.problem is None]


def _numeric_first(value: str) -> tuple:
    """Sort key: numbers by value (0.04 before 0.2), then other strings by name."""
    try:
        return (0, float(value), "")
    except ValueError:
        return (1, 0.0, value)


def merged_note(group: Group) -> str:
    """The sentence that says a group merges runs swept over a setting it does not read, and which runs repeat
    another (empty when it merges nothing)."""
    merged = {k: v for k, v in group.unread.items() if len(v) > 1}
    if not merged:
        return ""
    swept = "; ".join(f"{k} = {', '.join(sorted(v, key=_numeric_first))}" for k, v in merged.items())
    repeats = ", ".join(r.name for r in group.repeats)
    return (f"{group.label}: one group over {swept}: {group.algo.upper()} does not read "
            f"{' or '.join(merged)} with reference {group.strategy}, so these runs repeat one configuration; the "
            f"first run of each SFT start and seed is counted" + (f", the repeats ({repeats}) are not" if repeats
                                                                  else ""))


def _rank(name: str, order: tuple[str, ...]) -> tuple:
    """Known names in their order, then the rest alphabetically."""
    return (order.index(name), "") if name in order else (len(order), name)


def _same_value(value: str):
    """What tells a setting's values apart: a finite number by its value (``1`` and ``1.0`` alike), else the text."""
    number = spelled_number(value)
    return float(number) if number is not None and math.isfinite(number) else value


def group_runs(runs: list[Run]) -> dict[str, list[Group]]:
    """algo -> its groups, ordered by strategy (as ``REFERENCE_STRATEGIES``, unknown ones after, by name) then
    settings; every run (failed too) is in one."""
    groups: dict[tuple, Group] = {}
    for run in runs:
        # ``algo=`` / ``reference=`` are left out: they are the table and the strategy already
        swept = swept_settings(run.overrides)
        unread = {k: swept.pop(k) for k in UNREAD_SETTINGS.get((run.algo, run.strategy), ()) if k in swept}
        settings = tuple(sorted(swept.items()))
        identity = tuple((k, _same_value(v)) for k, v in settings)
        key = (run.algo, run.strategy, run.loss_type, run.nll_weight, run.objective, identity)
        if key not in groups:
            groups[key] = Group(run.algo, run.strategy, settings)
        g = groups[key]
        for k, v in unread.items():
            values = g.unread.setdefault(k, [])
            if _same_value(v) not in map(_same_value, values):
                values.append(v)
        unit = (run.sft_start, run.seed)
        if unread and run.problem is None and any((r.sft_start, r.seed) == unit for r in g.completed):
            g.repeats.append(run)
        else:
            g.runs.append(run)

    by_algo: dict[str, list[Group]] = {}
    for g in groups.values():
        by_algo.setdefault(g.algo, []).append(g)
    for algo, gs in by_algo.items():
        gs.sort(key=lambda g: (_rank(g.strategy, REFERENCE_STRATEGIES), natural_key(str(g.settings))))
        _label(gs)
    return dict(sorted(by_algo.items(), key=lambda kv: _rank(kv[0], ALGO_ORDER)))


DPO_LOSS_NAMES = {"simpo": "SimPO", "orpo": "ORPO", "ipo": "IPO", "hinge": "SLiC (hinge)", "robust": "rDPO",
                  "bco_pair": "BCO", "sppo_hard": "SPPO", "nca_pair": "NCA", "aot": "AOT", "aot_pair": "AOT-pair",
                  "exo_pair": "EXO", "apo_zero": "APO-zero", "apo_down": "APO-down", "sft": "NLL only"}
"""Published names of the DPO family's losses (TRL's ``loss_type`` values); sigmoid is DPO itself."""
DPO_REFERENCE_NAMES = {"fixed": "DPO", "periodic_reset": "TR-DPO hard", "ema": "TR-DPO soft",
                       "kl_triggered": "DPO, KL-triggered reset", "none": "DPO"}
"""DPO (sigmoid) by reference strategy (keyed by ``REFERENCE_STRATEGIES``: tests/test_config_checks.py): TR-DPO
(Gorbatovski et al. 2024) is DPO with a moving reference."""


def variant_name(algo: str, strategy: str, loss_type: str | None, nll_weight: float = 0.0,
                 objective: str = "grpo") -> str:
    """What a reader calls the group: ``ORPO``, ``SimPO``, ``TR-DPO hard (periodic_reset)``, ``RPO (fixed)``
    (a reference-based loss plus an NLL term); GRPO's continued-SFT baseline: ``continued_sft`` (its
    ``algo.objective``); other algorithms (and DPO runs that do not record a loss) keep the strategy's name."""
    if algo == "grpo" and objective != "grpo":
        return objective  # continued_sft: the same word as the config's value and W&B's job type
    if algo != "dpo" or loss_type is None:
        return strategy
    if nll_weight > 0 and loss_type not in DPO_LOSS_NAMES:
        base = "RPO" if strategy in ("fixed", "none") else DPO_REFERENCE_NAMES.get(strategy, "DPO") + " + NLL"
        return f"{base} ({strategy}, nll_weight={nll_weight:g})"
    if loss_type in DPO_LOSS_NAMES:
        name = DPO_LOSS_NAMES[loss_type]
        return name if strategy == "none" else f"{name} ({strategy} reference)"
    return f"{DPO_REFERENCE_NAMES.get(strategy, 'DPO')} ({strategy})"


def _label(groups: list[Group]) -> None:
    """The variant's name (the strategy's, outside DPO) plus the settings that tell this group apart
    from its algorithm's others.

    A setting shared by every group (say ``task=gsm8k`` on all jobs) says nothing and is left out;
    one that only some groups set (``reference.reset_every`` on periodic_reset) is shown where set;
    ``dpo_variant`` / ``grpo_variant`` are the name already; two periodic_reset groups that would read
    alike (``grpo_variant=reset_500`` and ``reset_100``) are told apart by their interval.
    """
    keys = sorted({k for g in groups for k, _ in g.settings} - {"dpo_variant", "grpo_variant", "algo.objective"})
    differing = [k for k in keys if len({dict(g.settings).get(k) for g in groups}) > 1]
    for g in groups:
        d = dict(g.settings)
        shown = [f"{k}={d[k]}" for k in differing if k in d]
        first = g.runs[0] if g.runs else None
        name = variant_name(g.algo, g.strategy, first.loss_type if first else None, first.nll_weight if first else 0.0,
                            first.objective if first else "grpo")
        g.label = name + (f" ({', '.join(shown)})" if shown else "")
    labels = [g.label for g in groups]
    for g in groups:
        every = g.runs[0].reset_every if g.runs and g.strategy == "periodic_reset" else None
        if labels.count(g.label) > 1 and every is not None:
            g.label += f" (every {every})"
