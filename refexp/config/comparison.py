"""The root's ``comparison`` block: the comparison an experiment was planned for, declared before it runs.

A sweep's report (``refexp-report``, and the sweep callback ``refexp/sweep.py``) reads it from the runs'
``resolved_config.yaml``: the verdict pairs these arms against this baseline over these seeds only; runs
outside it are listed and left out. An empty block (no ``arms``) declares nothing: the report is then
exploratory and needs ``refexp-report --baseline``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import check

COMPARED_METRICS = ("eval/accuracy",)
"""Metrics a verdict can be about: those each evaluation records per prompt (``eval_outcomes.jsonl``)."""


@dataclass
class ComparisonConfig:
    """The pre-registered comparison: which runs a verdict is about and what it compares. Set in an experiment
    file (``conf/experiment/*.yaml``); empty (no arms) everywhere else."""

    arm_key: str = ""
    """The swept override whose value names a run's arm (``grpo_variant``, ``dpo_variant``, ``reference``)."""
    arms: list[str] = field(default_factory=list)
    """The values of ``arm_key`` the comparison is about; empty: no comparison declared."""
    baseline: str = ""
    """The arm every other arm is paired against (one of ``arms``)."""
    seeds: list[int] = field(default_factory=list)
    """The ``training.seed`` values planned; runs of other seeds are listed and left out of the verdict."""
    metric: str = "eval/accuracy"
    """The metric compared (its final value, and its value at each of ``at_steps``)."""
    at_steps: list[int] = field(default_factory=list)
    """Steps at which the metric is compared too (``refexp-report --at-steps``)."""
    chosen_on_test: list[str] = field(default_factory=list)
    """Hyper-parameters (dotted keys) chosen by looking at test accuracy, not validation: the report's setup
    block names them, since they favour the arms they were tuned for."""

    @property
    def declared(self) -> bool:
        """Whether this block declares a comparison (it has arms)."""
        return bool(self.arms)

    def __post_init__(self) -> None:
        if not self.arms:
            return
        check(bool(self.arm_key), "comparison.arm_key", self.arm_key, "the swept key naming the arms (grpo_variant)")
        check(len(set(self.arms)) == len(self.arms), "comparison.arms", self.arms, "distinct arm names")
        check(self.baseline in self.arms, "comparison.baseline", self.baseline,
              "one of comparison.arms (" + ", ".join(self.arms) + ")")
        check(len(self.arms) >= 2, "comparison.arms", self.arms, "at least the baseline and one other arm")
        check(bool(self.seeds) and all(isinstance(s, int) and s >= 0 for s in self.seeds), "comparison.seeds",
              self.seeds, "a non-empty list of seeds >= 0")
        check(self.metric in COMPARED_METRICS, "comparison.metric", self.metric,
              "one of " + ", ".join(COMPARED_METRICS))
        check(all(isinstance(s, int) and s >= 0 for s in self.at_steps), "comparison.at_steps", self.at_steps,
              "steps >= 0")
