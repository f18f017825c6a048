"""The root's own blocks (not config groups): ``eval``, ``sft`` and ``rm``, set in place (``eval.every=25``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from .errors import check, non_negative, positive_int


@dataclass
class EvalConfig:
    """Held-out measurements made the same way for every strategy."""

    every: int = 20
    """kl/init and eval/accuracy every this many steps (and at step 0 and the end)."""
    num_prompts: int = 200
    """Held-out prompts for greedy accuracy."""
    kl_prompts: int = 256
    """Held-out prompts for kl/init, and for kl/init_retain on the retained skills' (completions sampled from the
    policy): the frontier's x, so enough that its sampling error is small beside the drift between betas."""
    kl_samples: int = 1
    """Completions sampled per ``kl_prompts`` prompt for the drift (``kl/init``, ``kl/init_exact`` and their
    ``_retain`` forms, DPO's ``kl/ref``), each token weighted equally as with one. More samples average the sampled
    prefixes' noise down; the exact KL already removes the noise of the token sampled at each position, and the
    prompts' noise (which ``kl_prompts`` prompts) remains whatever this is. The first sample of each prompt is the
    one a run with 1 draws."""
    pass_k: int = 8
    """``eval/pass_at_k``'s k: the chance that at least one of k completions sampled at the training temperature
    (GRPO's ``algo.temperature``, else 1) is correct, on the first ``pass_k_prompts`` held-out prompts; a policy
    whose distribution collapsed onto one answer loses it while its greedy accuracy stays. 0 = not measured."""
    pass_k_samples: Optional[int] = None
    """Completions sampled per prompt for ``eval/pass_at_k`` (n >= ``pass_k``): with n > k the unbiased estimator
    1 - C(n-c, k) / C(n, k) of Chen et al. 2021 (c of the n correct) has less variance; None = ``pass_k``."""
    pass_k_prompts: int = 64
    """Held-out prompts ``eval/pass_at_k`` samples for (each ``pass_k_samples`` times): its compute budget."""
    log_samples: int = 8
    """Completions kept per evaluation (the first held-out prompts' greedy ones) and per evaluation step of
    GRPO (the first rollouts): ``<run dir>/samples.jsonl`` and a W&B table; 0 keeps none."""

    def __post_init__(self) -> None:
        check(isinstance(self.log_samples, int) and self.log_samples >= 0, "eval.log_samples", self.log_samples,
              "an integer >= 0")
        positive_int("eval.every", self.every)
        positive_int("eval.num_prompts", self.num_prompts)
        positive_int("eval.kl_prompts", self.kl_prompts)
        positive_int("eval.kl_samples", self.kl_samples)
        check(isinstance(self.pass_k, int) and not isinstance(self.pass_k, bool) and self.pass_k >= 0, "eval.pass_k",
              self.pass_k, "an integer >= 0 (0: no eval/pass_at_k)")
        positive_int("eval.pass_k_prompts", self.pass_k_prompts)
        check(self.pass_k_samples is None or (isinstance(self.pass_k_samples, int)
                                              and self.pass_k_samples >= max(1, self.pass_k)),
              "eval.pass_k_samples", self.pass_k_samples, f"None or an integer >= eval.pass_k={self.pass_k}")

    def pass_k_n(self) -> int:
        """Completions sampled per prompt for ``eval/pass_at_k`` (``pass_k_samples``, default ``pass_k``)."""
        return self.pass_k if self.pass_k_samples is None else self.pass_k_samples


@dataclass
class SFTConfig:
    """The SFT stage that makes the starting policy and the fixed reference. Cached by a hash of
    everything that determines it (model, task, this block), so a sweep trains it once."""

    enable: bool = True
    """False skips the stage: the policy, the reference and the ``kl/init`` anchor all start from the
    pretrained checkpoint ``model.hf_assets_path`` (which must then be set, or ``model.pretrained``; nothing to do
    for ``algo=sft``)."""
    steps: int = 4000
    """Step cap; training stops earlier at a validation plateau or at ``target_accuracy``."""
    min_steps: int = 1000
    """No plateau stop before this step: on the embedded task the loss first sits on a plateau for a few
    hundred steps before accuracy jumps, and that plateau is not convergence."""
    patience: int = 10
    """After ``min_steps``, stop once the validation loss (``sft/val_loss``, NLL per demonstration token)
    has not fallen below its best by ``min_delta`` for this many evaluations in a row: the stage has converged. The
    loss, not the accuracy: on the embedded task accuracy sits flat near zero before it jumps. 0 = no plateau rule."""
    min_delta: float = 0.002
    """The fall in validation loss (nats per token) that counts as progress and resets ``patience``."""
    target_accuracy: float = 1.0
    """Stop as soon as validation greedy exact match reaches this (1.0: only at a perfect score)."""
    eval_every: int = 25
    """Steps between validation evaluations (what both stop rules read)."""
    batch_size: int = 256
    """Demonstrations per step. On the embedded task a smaller batch leaves the wait before accuracy jumps to the
    seed, for some seeds past the step cap (docs/headroom-task.md, "Why the start model is 256 wide and trains on
    batches of 256")."""
    lr: float = 1e-3
    """Peak learning rate of the SFT stage."""
    warmup_steps: int = 50
    """Linear learning-rate warm-up steps."""
    decay_ratio: float = 1.0
    """Share of the ``steps`` cap after warm-up over which the LR decays to 0 on a cosine (torchtitan's
    schedule; 0 = constant): a converged start needs the LR to come down, or validation loss keeps jumping."""
    weight_decay: float = 0.0
    """Decoupled weight decay."""
    seed: int = 0
    """Seeds the SFT model's init and batch order (part of the cache key): another value trains another,
    independent start. Swept (``sft.seed=0,1 training.seed=0,1,2``) every arm runs from every start; a report
    pairs runs by start and seed and nests the seeds in the starts (docs/runs.md, "How to read a report")."""
    checkpoint: Optional[str] = None
    """Use this SFT checkpoint dir (a refexp SFT output) instead of training/reusing one."""
    cache_dir: str = "${oc.env:REFEXP_CACHE,${oc.env:HOME}/.cache/refexp}"
    """Cache of generated task data and SFT outputs ($REFEXP_CACHE, else ~/.cache/refexp)."""

    def __post_init__(self) -> None:
        check(isinstance(self.enable, bool), "sft.enable", self.enable, "true or false")
        check(self.enable or self.checkpoint is None, "sft.checkpoint", self.checkpoint,
              "None when sft.enable=false (the run starts from model.hf_assets_path, not an SFT output)")
        check(isinstance(self.steps, int) and self.steps >= 0, "sft.steps", self.steps, "an integer >= 0")
        check(0.0 <= self.target_accuracy <= 1.0, "sft.target_accuracy", self.target_accuracy, "a number in [0, 1]")
        check(isinstance(self.patience, int) and self.patience >= 0, "sft.patience", self.patience, "an integer >= 0")
        check(isinstance(self.min_steps, int) and self.min_steps >= 0, "sft.min_steps", self.min_steps,
              "an integer >= 0")
        check(isinstance(self.min_delta, (int, float)) and self.min_delta >= 0, "sft.min_delta", self.min_delta,
              "a number >= 0")
        positive_int("sft.eval_every", self.eval_every)
        positive_int("sft.batch_size", self.batch_size)
        check(self.lr > 0, "sft.lr", self.lr, "a number > 0")
        check(isinstance(self.decay_ratio, (int, float)) and 0 <= self.decay_ratio <= 1, "sft.decay_ratio",
              self.decay_ratio, "a number in [0, 1]")


RM_LOSSES = ("bce", "pairwise")
"""``rm.loss``'s values (refexp/algos/rm.py)."""


@dataclass
class RMStageConfig:
    """The reward-model stage: a reward model for the task trained from the start (SFT) model's own samples labelled
    by the task's verifier (Cobbe et al. 2021's outcome verifiers), cached by a hash of what determines it and
    exported for ``task.reward_model`` (``algo=rm`` runs only this stage; ``task.reward_model=rm`` trains or finds it
    at a GRPO run's start; refexp/algos/rm.py, docs/reward-models.md)."""

    num_samples: int = 2048
    """Labelled samples in all, each scored by the verifier, shared equally by the sources (``temperatures``,
    ``policies``). Fewer make a weaker, more exploitable proxy."""
    samples_per_prompt: int = 4
    """Completions sampled per prompt (``num_samples / samples_per_prompt`` prompts, each given to one source)."""
    temperatures: list[float] = field(default_factory=lambda: [1.0])
    """Sampling temperatures: every model (the start model, then each of ``policies``) samples at each of them,
    one source per (model, temperature), each on its own share of the prompts."""
    policies: list[str] = field(default_factory=list)
    """Policies whose samples are added to the start model's, so the reward model also sees what an optimised
    policy writes: each an HF export (``config.json`` + safetensors, e.g. a GRPO run's ``checkpoint/hf`` written
    with ``checkpoint.last_save_in_hf=true``) or a run dir holding one; checked before any sampling."""
    loss: str = "bce"
    """``bce``: binary cross-entropy of the logit against each sample's label (pointwise). ``pairwise``: the
    Bradley-Terry loss −log σ(r_right − r_wrong) over the (right, wrong) pairs of completions of the same prompt
    (InstructGPT's reward-model loss), what GRPO's within-prompt normalisation reads; needs ``samples_per_prompt``
    >= 2 (refexp/algos/rm_pairs.py)."""
    val_fraction: float = 0.125
    """Share of the prompts (with all their samples) held out to measure the reward model and keep its best step."""
    steps: int = 300
    """Optimizer steps."""
    batch_size: int = 64
    """Labelled samples per step."""
    lr: float = 3.0e-4
    """AdamW learning rate (constant), backbone and head alike."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    eval_every: int = 50
    """Steps between measurements on the held-out samples (and the last step)."""
    seed: int = 0
    """Seeds the prompts drawn, their samples, the fresh score head and the batch order."""

    def __post_init__(self) -> None:
        positive_int("rm.num_samples", self.num_samples)
        positive_int("rm.samples_per_prompt", self.samples_per_prompt)
        check(isinstance(self.temperatures, (list, tuple)) and len(self.temperatures) > 0, "rm.temperatures",
              self.temperatures, "a non-empty list of numbers > 0, e.g. [0.7,1.0,1.5]")
        for t in self.temperatures:
            check(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t > 0,
                  "rm.temperatures[]", t, "a number > 0")
        check(len(set(self.temperatures)) == len(self.temperatures), "rm.temperatures", self.temperatures,
              "distinct numbers (each temperature is one source of samples)")
        check(isinstance(self.policies, (list, tuple)), "rm.policies", self.policies, "a list of dirs")
        for i, d in enumerate(self.policies):
            check(isinstance(d, str) and d != "", f"rm.policies[{i}]", d, "a dir path (an HF export or a run dir)")
        n_sources = (1 + len(self.policies)) * len(self.temperatures)
        check(self.num_samples >= n_sources * self.samples_per_prompt * 2, "rm.num_samples", self.num_samples,
              f"at least 2 x rm.samples_per_prompt={self.samples_per_prompt} x the {n_sources} sources "
              f"((1 + len(rm.policies)) x len(rm.temperatures)): a training and a held-out prompt of each")
        check(self.loss in RM_LOSSES, "rm.loss", self.loss, f"one of {', '.join(RM_LOSSES)}")
        check(self.loss != "pairwise" or self.samples_per_prompt >= 2, "rm.samples_per_prompt",
              self.samples_per_prompt, "at least 2 with rm.loss=pairwise (its pairs are a right and a wrong "
              "completion of the same prompt)")
        check(0 < self.val_fraction < 1, "rm.val_fraction", self.val_fraction, "a number in (0, 1)")
        positive_int("rm.steps", self.steps)
        positive_int("rm.batch_size", self.batch_size)
        check(self.lr > 0, "rm.lr", self.lr, "a number > 0")
        non_negative("rm.weight_decay", self.weight_decay)
        positive_int("rm.eval_every", self.eval_every)
        check(isinstance(self.seed, int) and self.seed >= 0, "rm.seed", self.seed, "an integer >= 0")
