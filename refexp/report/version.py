"""Which report code rendered a report: ``REPORT_VERSION``, the one number to bump whenever what a report says
changes (a verdict rule, a family, a column, a sentence), and the refexp commit of the checkout that rendered it.

``summary.json`` records both (``rendered_by``); a committed report whose runs are not kept carries the version it
was rendered by in a notice at its top (``refexp/report/writing/runs_not_stored.py``), and
``tests/test_report_version.py`` fails when a committed report whose runs are in the repo was rendered by an older
version.
"""

from __future__ import annotations

from typing import Optional

from refexp.record.provenance import provenance

REPORT_VERSION = 9
"""Bump whenever a report's output changes. 0: reports rendered before the number existed (no ``report_version`` in
their summary.json). 1: Holm decides over shared-prompt bootstraps, three verdicts (higher/lower, equivalent,
inconclusive), primary contrasts (``comparison.primary``) form the verdict family and the first screen, every other
table is secondary, ``none`` at several β is one group, the how-to-read text comes last. 2: the headline is
``comparison.metric``'s final value (any held-out metric with per-prompt outcomes, e.g. ``eval/gold``), named on the
first screen and in summary.json's ``comparison.metric``; the other such metrics are endpoints of their own. 3: the
primary contrasts at a declared matched drift (``comparison.matched``) and the setup block's experiment-config line
(its last commit against the runs' first start). 4: the tuned comparison states its validation budget
(``comparison.select.budget``: the first N validation prompts, or a refusal), and each arm's oracle choice (on the
test metric: an upper bound) has its own section; runs that log ``eval/gold`` get Gao et al.'s RL form fitted per
reference strategy (``statistics/gao.py``: a table, a plot, summary.json's ``gao``). 5: runs that log ``eval/gold``
and ``val/gold`` get the gold-peak tables (``statistics/gold_peak.py``: each group's test gold at the step validation
chose against its step 0, each arm at its gold peak against the baseline's), the declared matched contrasts say
between which runs each curve was read (``declared_matched.bracket``), an unfinished run that has not recorded its SFT
start is no start of its own in the setup block, a validation budget's floors read its prompts too, and groups across
a decimal setting are ordered by its value (0.05 before 0.1). 6: report.md writes every ``<`` that could open raw
HTML (a tag in a completion or a run name: ``<answer>``, ``<script>``) as ``&lt;``, as report.html escapes it; a run's
``.hydra/config.yaml`` has its node interpolations followed and no resolver run (``${oc.env:...}`` prints as
written); a sample's reward that is no number prints as written, "(not a number)". 7: where declared primary
contrasts exist and none can be tested for want of seeds (one seed per arm), the first screen says "One seed: no
claim" once and shows each arm against its start (final accuracy and its change, final retention and its change,
kl/init) and the accuracy-vs-drift plot, instead of the no-claim lines and the method paragraph. 8: Gao et al.'s
fitted coefficients print as α_RL, β_RL (summary.json's ``gao.fits[].alpha_rl``, ``beta_rl``, and their intervals),
never as a bare β beside the KL coefficient ``algo.beta``. 9: a matched reading obeys ``comparison.matched.max_gap``
(the step on the matched axis, ``statistics/reading_rules.py``) and a no claim counts every failing replicate by
reason; each compared matched row prints its bracket and its other-chord estimate; the drift resample draws the kl
prompts once per replicate for every run and each matched contrast prints its x-noise share; the first screen's
forest plot (``report_plots/primary_contrasts.png``); a declared ``comparison.matched.estimand: crossing``; an
experiment file edited after its runs and restored reads as their version (``restored_in``)."""


def rendered_by(version: int = REPORT_VERSION, commit: Optional[str] = "current") -> dict:
    """The summary.json fields that say which code rendered it: ``{"report_version": version, "rendered_by_commit":
    commit}``; ``commit`` "current" reads this checkout's (None outside a git checkout, never an error)."""
    if commit == "current":
        commit = provenance()["commit"]
    return {"report_version": int(version), "rendered_by_commit": commit}
