"""The ``algo/`` group: one schema per algorithm (``algo=sft|grpo|dpo|rm``), each with only its own fields."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from omegaconf import MISSING

from refexp.choices import (
    ADVANTAGE_SCALES,
    DPO_REFERENCE_FREE_LOSSES,
    GRPO_LOSS_AGGS,
    GRPO_OBJECTIVES,
    OLD_LOGPROBS,
    PREFERENCE_LOSSES,
)

from .errors import ConfigError, check, non_negative, one_of, positive_int


@dataclass
class AlgoConfig:
    """Base of the algorithm schemas; ``algo=<name>`` picks the subclass."""

    name: str = MISSING
    """sft | grpo | dpo | rm (set by the option, not by ``algo.name``)."""


@dataclass
class SFTAlgoConfig(AlgoConfig):
    """``algo=sft``: run only the SFT stage (its settings are the root ``sft`` block)."""

    name: str = "sft"
    """Always sft."""


@dataclass
class GRPOConfig(AlgoConfig):
    """GRPO (Shao et al. 2024, DeepSeekMath eq. 3) with TRL 1.16's loss aggregations."""

    name: str = "grpo"
    """Always grpo."""
    prompts_per_step: int = 16
    """Prompts sampled per optimizer step (the global batch is prompts_per_step x group_size)."""
    group_size: int = 8
    """G completions per prompt."""
    beta: float = 1.0
    """KL coefficient (0 = no KL term even with a reference). 1, not TRL's 0.04, so that the penalty binds
    on the embedded task: with a small beta every reference strategy drifted alike."""
    kl_estimator: str = "k3"
    """k3 | k2: the per-token estimator in the loss's KL term (Schulman, 'Approximating KL divergence', 2020).
    k3's expected gradient is that of KL(ref||policy), k2's that of KL(policy||ref) (refexp/losses/kl.py); k1 is refused
    (zero expected gradient as a loss term). The reward penalty of ``kl_in_reward`` always uses k1."""
    loss_agg: str = "grpo"
    """A ``GRPOLossAgg`` (refexp/choices.py): how token losses are averaged."""
    eps_low: float = 0.2
    """Lower clip of the probability ratio (1 - eps_low)."""
    eps_high: float = 0.2
    """Upper clip of the probability ratio (1 + eps_high; DAPO raises it)."""
    advantage_scale: str = "group"
    """An ``AdvantageScale`` (refexp/choices.py): the std that divides (reward - group mean)."""
    updates_per_batch: int = 1
    """Optimizer steps on each rollout batch (TRL's num_iterations); >1 makes the clip bind."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts."""
    top_p: float = 1.0
    """Nucleus sampling of the rollouts (1 = off)."""
    max_new_tokens: Optional[int] = None
    """None = task.max_new_tokens."""
    share_prompt: bool = True
    """Training forwards (policy, reference) take one row per prompt, its G completions sharing one pass over
    the prompt (refexp/algos/shared_prompt.py; same log-probs, fewer tokens; attention through a dense mask,
    or causal attention over the gathered usual rows where that is cheaper: many long rollouts per prompt).
    Needs model.attn_backend=sdpa."""
    kl_in_reward: bool = False
    """Subtract beta * KL(sequence) (k1, summed over the completion) from the reward instead of adding a KL
    loss term."""
    kl_target: Optional[float] = None
    """Adaptive KL coefficient towards this KL (Ziegler et al. 2019's controller)."""
    kl_horizon: int = 10000
    """Horizon of the adaptive controller in samples (each step counts its global batch's rows, as Ziegler et
    al. 2019 and TRL): beta moves by at most 20% per ``kl_horizon`` samples."""
    objective: str = "grpo"
    """A ``GRPOObjective`` (refexp/choices.py). continued_sft is the continued-SFT baseline: the same prompts per step
    and the same steps, trained on their demonstrations with the SFT stage's token-mean NLL instead of rollouts
    and rewards (no reference: reference=none), so a comparison can tell what GRPO adds over more SFT from the
    same start."""
    tis_cap: Optional[float] = None
    """Truncated importance sampling (Yao et al. 2025): the clipped surrogate's ratio is taken against the
    trainer's own log-probs of the rollout, and each token's loss is weighted by min(pi_trainer / pi_rollout,
    tis_cap), correcting for a rollout engine whose numerics differ from the trainer's. None = off."""
    old_logprobs: str = "auto"
    """An ``OldLogprobs`` (refexp/choices.py): what the clipped ratio of a batch's first update is taken
    against. ``rollout``: the engine's log-probs of the sampled tokens; ``trainer``: the trainer's own, from that
    update's forward (no extra pass; the ratio is exactly 1 there, later updates on the batch use the same
    log-probs); ``auto``: trainer when the forward computes in bfloat16 (``training.compute_dtype``: the default
    on CUDA), where the built-in engine's KV-cache decode and the trainer's forward differ by bf16 rounding
    (``rollout/logprob_diff``) and the clip would fire on that noise; rollout in float32, where the two agree
    within 1e-4. ``algo.tis_cap`` takes the ratio against the trainer's (so rollout is refused with it)."""

    def __post_init__(self) -> None:
        if self.tis_cap is not None:
            check(self.tis_cap >= 1, "algo.tis_cap", self.tis_cap, "a number >= 1 or null (off)")
        one_of("algo.old_logprobs", self.old_logprobs, OLD_LOGPROBS)
        check(self.tis_cap is None or self.old_logprobs != "rollout", "algo.old_logprobs", self.old_logprobs,
              "auto or trainer with algo.tis_cap (truncated importance sampling takes the ratio against the "
              "trainer's log-probs), or algo.tis_cap=null")
        one_of("algo.objective", self.objective, GRPO_OBJECTIVES)
        positive_int("algo.prompts_per_step", self.prompts_per_step)
        check(isinstance(self.group_size, int) and self.group_size >= 2, "algo.group_size", self.group_size,
              "an integer >= 2 (advantages are relative within a group)")
        non_negative("algo.beta", self.beta)
        check(self.kl_estimator in ("k2", "k3"), "algo.kl_estimator", self.kl_estimator,
              "k3 or k2 (k1 = log pi - log ref has zero expected gradient as a loss term, E_pi[grad log pi] = 0, "
              "so it would not regularise; algo.kl_in_reward=true penalises the reward with k1)")
        one_of("algo.loss_agg", self.loss_agg, GRPO_LOSS_AGGS)
        non_negative("algo.eps_low", self.eps_low)
        non_negative("algo.eps_high", self.eps_high)
        one_of("algo.advantage_scale", self.advantage_scale, ADVANTAGE_SCALES)
        positive_int("algo.updates_per_batch", self.updates_per_batch)
        check(self.temperature > 0, "algo.temperature", self.temperature, "a number > 0")
        check(0 < self.top_p <= 1, "algo.top_p", self.top_p, "a number in (0, 1]")
        if self.max_new_tokens is not None:
            positive_int("algo.max_new_tokens", self.max_new_tokens)
        if self.kl_target is not None:
            check(self.kl_target > 0, "algo.kl_target", self.kl_target, "a number > 0 or null")
        positive_int("algo.kl_horizon", self.kl_horizon)


@dataclass
class DPOConfig(AlgoConfig):
    """The DPO family (Rafailov et al. 2023) and the reference-free SimPO / ORPO."""

    name: str = "dpo"
    """Always dpo."""
    loss_type: str = "sigmoid"
    """A ``DPOLossType`` (needs a reference) or a ``DPOReferenceFreeLoss`` (refexp/choices.py; sft = NLL of the
    chosen completions only, TRL's loss_type="sft": the continued-SFT baseline)."""
    beta: float = 1.0
    """Chosen on held-out test accuracy (embedded task, tiny model), not on validation, and not a published
    value: at the DPO paper's 0.1 the chosen log-probs fall (likelihood displacement) and test accuracy drops
    below the SFT model's. docs/compare_refs_dpo/report.md is run at 1. SimPO's beta is in its own units
    (conf/dpo_variant/simpo.yaml)."""
    label_smoothing: float = 0.0
    """Conservative DPO / robust DPO's assumed label-noise rate."""
    gamma: float = 0.5
    """SimPO's target reward margin gamma (TRL's ``simpo_gamma``; the loss uses gamma/beta)."""
    lam: float = 0.1
    """ORPO's weight on the odds-ratio term."""
    nll_weight: float = 0.0
    """RPO (Pang et al. 2024): add this times the token-mean NLL of the chosen completions to the preference loss
    (TRL's loss_type=["sigmoid", "sft"] with loss_weights=[1, nll_weight]); 0 = off."""
    pairs_per_step: int = 16
    """Preference pairs per optimizer step."""
    precompute_ref: bool = False
    """Compute reference log-probs of the whole preference set once, cache them on disk."""
    share_prompt: bool = True
    """One row per pair, chosen and rejected sharing one pass over the prompt (refexp/algos/shared_prompt.py;
    same log-probs, fewer tokens). Needs model.attn_backend=sdpa."""
    num_pairs: int = 2000
    """Preference pairs generated for the embedded task."""
    pair_seed: int = 0
    """Seeds the generation of those pairs (part of their cache key)."""

    def __post_init__(self) -> None:
        one_of("algo.loss_type", self.loss_type, PREFERENCE_LOSSES)
        check(self.beta > 0, "algo.beta", self.beta, "a number > 0")
        check(0 <= self.label_smoothing < 0.5, "algo.label_smoothing", self.label_smoothing, "a number in [0, 0.5)")
        if self.label_smoothing and self.loss_type in ("ipo", "hinge"):
            raise ConfigError(f"algo.label_smoothing={self.label_smoothing} is invalid with "
                              f"algo.loss_type={self.loss_type}: expected 0 (only sigmoid, robust and simpo smooth)")
        non_negative("algo.nll_weight", self.nll_weight)
        if self.nll_weight and self.loss_type in ("orpo", "sft"):
            raise ConfigError(f"algo.nll_weight={self.nll_weight} is invalid with algo.loss_type={self.loss_type}: "
                              f"that loss is an NLL term already (expected 0)")
        positive_int("algo.pairs_per_step", self.pairs_per_step)
        positive_int("algo.num_pairs", self.num_pairs)

    @property
    def reference_free(self) -> bool:
        """SimPO, ORPO and the NLL-only baseline hold no reference model."""
        return self.loss_type in DPO_REFERENCE_FREE_LOSSES

    @property
    def uses_chosen_nll(self) -> bool:
        """Whether the loss has an NLL term on the chosen completions (ORPO, NLL-only, RPO)."""
        return self.loss_type in ("orpo", "sft") or self.nll_weight > 0


@dataclass
class RMConfig(AlgoConfig):
    """``algo=rm``: run only the reward-model stage (its settings are the root ``rm`` block; refexp/algos/rm.py)."""

    name: str = "rm"
    """Always rm."""


ALGO_SCHEMAS = {"sft": SFTAlgoConfig, "grpo": GRPOConfig, "dpo": DPOConfig, "rm": RMConfig}
"""``algo=<name>`` -> its schema (registered as ``algo_<name>_schema``)."""
