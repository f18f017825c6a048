"""Every metric name a run logs, stated once: what it means, when it is logged, TRL's name for it.

``MetricLogger`` refuses a name that is not here (a typo would otherwise start a new dashboard series), the
W&B metric definitions (``refexp/components/wandb_conventions.py``) and the report take their names from here, and
``docs/metrics.md`` is generated from it: ``python -m refexp.record.metric_names`` rewrites the page.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

# ---------------------------------------------------------------- names other modules read
LOSS_TOTAL = "loss/total"
REWARD_MEAN = "reward/mean"
EVAL_ACCURACY = "eval/accuracy"
VAL_ACCURACY = "val/accuracy"
EVAL_RETENTION = "eval/retention"
VAL_RETENTION = "val/retention"
EVAL_PASS_AT_K = "eval/pass_at_k"
EVAL_PREF_ACCURACY = "eval/pref_accuracy"
EVAL_PREF_MARGIN = "eval/pref_margin"
LOGPS_CHOSEN_DELTA = "logps/chosen_delta"
REF_VERSION = "ref/version"
KL_INIT = "kl/init"
KL_INIT_RETAIN = "kl/init_retain"
KL_INIT_EXACT = "kl/init_exact"
KL_INIT_EXACT_RETAIN = "kl/init_exact_retain"
KL_REF = "kl/ref"
REWARDS_ACCURACIES = "rewards/accuracies"
REWARDS_MARGINS = "rewards/margins"
PERF_STEP_S = "perf/step_s"
PERF_REF_FWD_S = "perf/ref_fwd_s"
PERF_GEN_S = "perf/gen_s"
MEM_PEAK_RSS_MB = "mem/peak_rss_mb"
MEM_PEAK_GPU_MB = "mem/peak_gpu_mb"
SFT_VAL_ACCURACY = "sft/val_accuracy"
REWARD_GOLD = "reward/gold"
EVAL_GOLD = "eval/gold"
VAL_GOLD = "val/gold"

RENAMED = {"rewards/accuracy": REWARDS_ACCURACIES, "rewards/margin": REWARDS_MARGINS}
"""Old metric name -> the name logged now (TRL's): runs logged before the rename read as if they had logged
the new name (``current_names``), so committed sweeps stay comparable with new ones."""


@dataclass(frozen=True)
class Metric:
    name: str
    meaning: str
    logged: str
    """When: which algorithm, and how often (every step, at evaluation, once)."""
    trl: str = "—"
    """TRL 1.16's name for the same quantity, where it has one."""
    summary: Optional[str] = None
    """The W&B runs table's summary of the metric (``max``/``last``); None: W&B's default (the last value)."""
    thresholded: bool = False
    """A share of floating-point comparisons (a greedy argmax, a sign, a clip bound) that nothing trains on:
    where a compared value sits at a tie (a DPO margin of exactly 0 at policy == reference), two runs whose
    floats differ in the last bits (other ranks, chunks or CPU kernels) count it one unit apart. Such runs are
    compared on the continuous quantities instead (``rewards/margins`` behind ``rewards/accuracies``)."""


_EVAL = "step 0, every `eval.every` steps and the last step"
METRICS: tuple[Metric, ...] = (
    Metric(LOSS_TOTAL, "the optimised loss of the step", "every step (GRPO, DPO, the SFT stage)",
           "`loss` (the Trainer's)"),
    Metric("loss/policy", "GRPO: the clipped-surrogate part of the loss", "GRPO, every step"),
    Metric("loss/kl", "GRPO: the beta·KL part of the loss", "GRPO with a reference, every step"),
    Metric("loss/sft", "the continued-SFT baseline's NLL per demonstration token (equal to `loss/total`)",
           "GRPO with `algo.objective=continued_sft`, every step"),
    Metric("loss/nll", "NLL per chosen token: ORPO's SFT term, RPO's (`algo.nll_weight`) added term, or the "
           "whole loss of `loss_type=sft`", "DPO with ORPO / `algo.nll_weight` / `loss_type=sft`, every step"),
    Metric("loss/or", "ORPO's odds-ratio term", "DPO `loss_type=orpo`, every step"),
    Metric(REWARD_MEAN, "GRPO: task reward of the sampled completions (global batch)", "GRPO, every step",
           "`reward`", summary="last"),
    Metric(REWARD_GOLD, "GRPO with a learned reward (`task.reward_model`, `task.reward_funcs`): the gold reward "
           "(the task's verifier, or `task.gold_reward_model`) of the same sampled completions, never optimised",
           "GRPO with a learned reward, every step", summary="last"),
    Metric("reward/std", "GRPO: its population std (TRL's is the sample std, n−1)", "GRPO, every step",
           "`reward_std`"),
    Metric("reward/shaped_mean", "GRPO: reward after `algo.kl_in_reward` shaping (beta times the sequence's k1 "
           "KL subtracted)", "GRPO, every step"),
    Metric("frac_reward_zero_std", "fraction of prompt groups whose rewards are all equal (zero advantage, no "
           "learning signal), over the global batch", "GRPO, every step", "same name"),
    Metric("completions/clipped_ratio", "fraction of completions that reached `max_new_tokens` without a stop id",
           "GRPO, every step", "same name"),
    Metric("rollout/logprob_diff", "mean over completion tokens of |rollout engine's log-prob − trainer's| for the "
           "same tokens and weights (below 1e-4 with the built-in engine in fp32); `algo.tis_cap` corrects for it",
           "GRPO (policy objective), every step"),
    Metric("rollout/logprob_diff_max", "the max of the same difference", "GRPO (policy objective), every step"),
    Metric(EVAL_ACCURACY, "greedy exact match (mean reward) on the first `eval.num_prompts` held-out *test* "
           "prompts (never used to stop or select); per prompt in `eval_outcomes.jsonl`; with a learned reward its "
           "mean (the proxy; the verifier's is `eval/gold`)",
           f"{_EVAL}; `algo=sft` and the SFT stage: once, on the model the stage keeps", summary="max",
           thresholded=True),
    Metric(VAL_ACCURACY, "the same on the validation split, when the task has one (`task.val_fraction`, "
           "`task.val_path`); what `hparams_search` and `comparison.select` choose on; per prompt in "
           "`eval_outcomes.jsonl` (split `val`), whose first `comparison.select.budget` prompts a budgeted "
           "choice reads",
           f"{_EVAL}, when the task has a validation split", thresholded=True),
    Metric(EVAL_RETENTION, "greedy exact match on the first `eval.num_prompts` held-out *test* prompts of the skills "
           "the SFT stage taught and RL does not train (`task.ops` minus `task.rl_ops`): what RL keeps of the start; "
           "per prompt in `eval_outcomes.jsonl`",
           f"{_EVAL}, when `task.rl_ops` leaves out some of `task.ops`; `algo=sft` and the SFT stage: once, on the "
           "model the stage keeps", summary="last", thresholded=True),
    Metric(VAL_RETENTION, "the same on the validation split (what a selection rule with a retention floor reads)",
           f"{_EVAL}, when `task.rl_ops` leaves out some of `task.ops` and the task has a validation split",
           thresholded=True),
    Metric(EVAL_PASS_AT_K, "pass@k with k = `eval.pass_k`: the chance that one of k completions sampled at the "
           "training temperature (and GRPO's `algo.top_p`) is correct (the verifier's reward ≥ 1), on the first "
           "`eval.pass_k_prompts` held-out test prompts (of the RL skills): per prompt the unbiased estimator of "
           "Chen et al. 2021 (eq. 1), 1 − C(n−c, k) / C(n, k) with n = `eval.pass_k_samples` samples of which c are "
           "correct, averaged over prompts; the samples are keyed to the prompt and the sample's index, as "
           "`kl/init`'s; a policy whose distribution collapsed onto one answer keeps its greedy accuracy and loses "
           "this; per prompt in `eval_outcomes.jsonl`",
           f"{_EVAL}, when `eval.pass_k` > 0 and the task has a reward", summary="last", thresholded=True),
    Metric(EVAL_GOLD, "with a learned reward: the gold reward (the task's verifier, or `task.gold_reward_model`) "
           "of the same greedy held-out completions, whose learned (proxy) reward is then `eval/accuracy` "
           "(docs/reward-models.md); per prompt in `eval_outcomes.jsonl`",
           f"GRPO with a learned reward, {_EVAL}", thresholded=True),
    Metric(VAL_GOLD, "the same on the validation split; per prompt in `eval_outcomes.jsonl` (split `val`): a "
           "`comparison.select.budget` reads the gold of its first N prompts only, the labels a user could afford",
           f"GRPO with a learned reward and a validation split, {_EVAL}", thresholded=True),
    Metric("rm/loss", "`algo=rm` (the reward-model stage): the reward model's `rm.loss` on the training batch: "
           "binary cross-entropy against the verifier's labels, or the Bradley-Terry loss on within-prompt (right, "
           "wrong) pairs",
           "`algo=rm`, every step"),
    Metric("rm/val_loss", "`algo=rm`: the same on its held-out labelled samples", "`algo=rm`, every `rm.eval_every` "
           "steps and the last"),
    Metric("rm/val_accuracy", "`algo=rm`: share of held-out labelled samples whose label the reward model's sign "
           "gets right", "`algo=rm`, every `rm.eval_every` steps and the last", thresholded=True),
    Metric("rm/val_pair_accuracy", "`algo=rm`: share of held-out (right, wrong) pairs of completions of the same "
           "prompt that the reward model scores in the right order, ties 1/2 (what GRPO's within-prompt "
           "normalisation reads)", "`algo=rm`, every `rm.eval_every` steps and the last, when a held-out prompt has "
           "a right and a wrong sample", thresholded=True),
    Metric("rm/positive_rate", "`algo=rm`: share of its labelled samples the verifier scored correct",
           "`algo=rm`, once"),
    Metric("rm/dir", "`algo=rm`: the reward model's HF checkpoint dir (what `task.reward_model` takes)",
           "`algo=rm`: final value only (W&B summary)"),
    Metric("sft/val_loss", "the SFT stage: NLL per demonstration token on the validation split, every skill it "
           "teaches (what its stop rules read)", "the SFT stage, every `sft.eval_every` steps"),
    Metric(SFT_VAL_ACCURACY, "the SFT stage: greedy exact match on the validation split, every skill it teaches "
           "(`task.ops`)",
           "the SFT stage, every `sft.eval_every` steps; `algo=sft`: the final value", thresholded=True),
    Metric("sft/grad_norm", "the SFT stage: gradient norm before clipping", "the SFT stage, every step"),
    Metric("sft/wall_s", "seconds the SFT stage trained", "`algo=sft`: final value only (W&B summary)"),
    Metric("sft/dir", "the SFT model's directory in the cache", "`algo=sft`: final value only (W&B summary)"),
    Metric(KL_INIT, "KL(policy ‖ the frozen initial (SFT) model), mean per-token k3 on the first `eval.kl_prompts` "
           "held-out prompts, `eval.kl_samples` sampled completions each (1 by default), averaged over completion "
           "tokens as `kl/ref` is; the "
           "sampling is keyed to the prompt only (common random numbers), so successive evaluations differ by the "
           "policy, not by sampling noise; completions are sampled, and every model's log-probs taken, at the run's "
           "sampling temperature (GRPO's `algo.temperature`; 1 for DPO), so a model equal to the policy is at 0 at "
           "any temperature; each prompt's linearised contribution (their mean is the value) in `eval_outcomes.jsonl`",
           _EVAL, summary="last"),
    Metric(KL_INIT_RETAIN, "the same on the first `eval.kl_prompts` held-out prompts of the skills RL does not "
           "train (`task.ops` minus `task.rl_ops`, where RL does not sample), sampled with the same keys: drift "
           "beside `eval/retention`; per prompt in `eval_outcomes.jsonl`",
           f"{_EVAL}, when `task.rl_ops` leaves out some of `task.ops`", summary="last"),
    Metric(KL_INIT_EXACT, "KL(policy ‖ frozen SFT model) on the same samples as `kl/init`, each position's KL "
           "summed over the whole vocabulary instead of the sampled token's k3 (the k3 is a one-sample estimate of "
           "it), averaged over completion tokens as `kl/init`: drift without the token-sampling noise (the prompts' "
           "and the sampled prefixes' remain; docs/algorithms.md); per prompt in `eval_outcomes.jsonl`",
           _EVAL, summary="last"),
    Metric(KL_INIT_EXACT_RETAIN, "the same on `kl/init_retain`'s samples (the skills RL does not train); per "
           "prompt in `eval_outcomes.jsonl`", f"{_EVAL}, when `task.rl_ops` leaves out some of `task.ops`",
           summary="last"),
    Metric(KL_REF, "KL(policy ‖ current reference), mean per-token k3 on the policy's own samples (absent when "
           "reference-free). GRPO: the training batch's completions; DPO: the `kl/init` samples, before that "
           "step's reference update", f"GRPO: every step; DPO: {_EVAL}", "GRPO: `kl`", summary="last"),
    Metric("kl/ref_chosen_tokens", "k3 between policy and reference log-probs on the batch's chosen (dataset) "
           "tokens: a drift diagnostic, not comparable with `kl/ref`", "DPO with a reference, every step"),
    Metric("kl/beta", "the KL coefficient the step used (moves with `algo.kl_target`, counting samples against "
           "`algo.kl_horizon`)", "GRPO with a reference, every step"),
    Metric(REF_VERSION, "how many times the reference changed", "every step (GRPO, DPO)"),
    Metric("ref/last_update_step", "the step of the reference's last change", "every step (GRPO, DPO)"),
    Metric("rewards/chosen", "DPO implicit reward of the chosen completions", "DPO, every step", "same name"),
    Metric("rewards/rejected", "DPO implicit reward of the rejected completions", "DPO, every step", "same name"),
    Metric(REWARDS_MARGINS, "DPO: mean chosen − rejected implicit reward", "DPO, every step", "same name"),
    Metric(REWARDS_ACCURACIES, "DPO: fraction of pairs whose chosen implicit reward is the larger",
           "DPO, every step", "same name", thresholded=True),
    Metric("logps/chosen", "DPO: the policy's summed log-prob of the chosen completions", "DPO, every step",
           "same name"),
    Metric("logps/rejected", "DPO: the policy's summed log-prob of the rejected completions", "DPO, every step",
           "same name"),
    Metric(LOGPS_CHOSEN_DELTA, "DPO: the policy's mean summed log-prob of the chosen completions of the first "
           "`eval.kl_prompts` pairs minus its step-0 value; a fall flags likelihood displacement", f"DPO, {_EVAL}"),
    Metric(EVAL_PREF_ACCURACY, "DPO on `task=preference`: `rewards/accuracies` over the first `eval.num_prompts` "
           "held-out pairs, from the policy and the current reference", f"DPO on `task=preference`, {_EVAL}",
           summary="max", thresholded=True),
    Metric(EVAL_PREF_MARGIN, "DPO on `task=preference`: `rewards/margins` over the same held-out pairs",
           f"DPO on `task=preference`, {_EVAL}"),
    Metric("eval/logp_correct", "DPO: the policy's mean summed log-prob (EOS included, as SFT's targets) of the "
           "task's reference completion on the `eval.kl_prompts` held-out prompts; a fall flags likelihood "
           "displacement (Pal et al. 2024, \"Smaug\"; Razin et al. 2024, \"Unintentional Unalignment\")",
           f"DPO on a task with answers, {_EVAL}"),
    Metric("clip/ratio", "GRPO: fraction of tokens clipped", "GRPO, every step", "`clip_ratio/region_mean`",
           thresholded=True),
    Metric("clip/low", "GRPO: fraction of tokens clipped at the low end", "GRPO, every step",
           "`clip_ratio/low_mean`", thresholded=True),
    Metric("clip/high", "GRPO: fraction of tokens clipped at the high end", "GRPO, every step",
           "`clip_ratio/high_mean`", thresholded=True),
    Metric("policy/entropy", "GRPO: mean token entropy of the sampled completions", "GRPO, every step",
           "`entropy`"),
    Metric("policy/completion_len", "GRPO: mean completion length", "GRPO, every step",
           "`completions/mean_length`"),
    Metric("optim/grad_norm", "gradient norm before clipping", "every step (GRPO, DPO)", "`grad_norm`"),
    Metric("optim/lr", "learning rate", "every step (GRPO, DPO)", "`learning_rate`"),
    Metric(PERF_STEP_S, "seconds of the step and its reference update (evaluation excluded)",
           "every step (GRPO, DPO)"),
    Metric(PERF_GEN_S, "seconds of generation (rollouts)", "GRPO, every step"),
    Metric(PERF_REF_FWD_S, "seconds of the reference's forward passes", "every step (GRPO, DPO)"),
    Metric("perf/tokens_per_s", "tokens (prompt + completion) of the step per second", "every step (GRPO, DPO)"),
    Metric(MEM_PEAK_RSS_MB, "peak resident memory of the process, MiB", "every step (GRPO, DPO)"),
    Metric(MEM_PEAK_GPU_MB, "this step's peak GPU memory allocated, MiB", "every step on a CUDA device"),
    Metric("mem/ref_params", "DPO: reference parameters held in memory (0 with the precomputed cache or "
           "`reference=none`)", "DPO, every step"),
    Metric("refcache/hits", "DPO: reference log-probs read from the precomputed cache",
           "DPO `algo.precompute_ref=true`, every step"),
    Metric("refcache/misses", "DPO: reference log-probs the precomputed cache lacked",
           "DPO `algo.precompute_ref=true`, every step"),
    Metric("refcache/built", "DPO: 1 when this run built the cache, 0 when it found it",
           "DPO `algo.precompute_ref=true`, the invocation's first step"),
    Metric("refcache/build_s", "DPO: seconds spent building (or loading) the cache",
           "DPO `algo.precompute_ref=true`, the invocation's first step"),
    Metric("orpo/log_odds_ratio", "ORPO: mean log odds ratio of chosen over rejected", "DPO `loss_type=orpo`, "
           "every step"),
    Metric("orpo/log_sigmoid_odds", "ORPO: mean log-sigmoid of that ratio", "DPO `loss_type=orpo`, every step"),
)
BY_NAME: Mapping[str, Metric] = {m.name: m for m in METRICS}


def unregistered(names) -> list[str]:
    """The names of ``names`` (``step`` aside) that are not in the registry, sorted."""
    return sorted(n for n in set(names) - {"step"} if n not in BY_NAME)


def summaries() -> dict[str, str]:
    """``{name: "max" | "last"}``: the W&B runs table's summaries that differ from its default."""
    return {m.name: m.summary for m in METRICS if m.summary}


def thresholded() -> frozenset[str]:
    """The names of the metrics that count floating-point comparisons (``Metric.thresholded``)."""
    return frozenset(m.name for m in METRICS if m.thresholded)


def current_names(row: Mapping) -> dict:
    """``row`` with the names of ``RENAMED`` replaced by today's (a row holding both keeps the new one)."""
    return {RENAMED.get(k, k): v for k, v in row.items() if not (k in RENAMED and RENAMED[k] in row)}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def metrics_page() -> str:
    """``docs/metrics.md``: the registry as a table."""
    lines = ["# Metrics", "",
             "<!-- generated by `python -m refexp.record.metric_names` from refexp/record/metric_names.py; "
             "do not edit -->", "",
             "Every metric goes to `<run dir>/metrics.jsonl` (one JSON object per logged step, with `step`) and, on "
             "rank 0, to W&B. A name not listed here is refused by the logger. The layout of the run dir is "
             "`refexp/record/layout.py`.", "",
             "| metric | meaning | logged | TRL 1.16 name |", "|---|---|---|---|"]
    lines += [f"| `{m.name}` | {_cell(m.meaning)} | {_cell(m.logged)} | {_cell(m.trl)} |" for m in METRICS]
    lines += ["", "TRL 1.16's names are given so that panels built for TRL runs (W&B shows them under `train/`) can "
              "show refexp's. Runs logged before the renames "
              + ", ".join(f"`{old}` → `{new}`" for old, new in RENAMED.items())
              + " are read by `python -m refexp.report` under the new names.",
              "", "W&B's runs table summarises "
              + ", ".join(f"`{k}` by its {v}" for k, v in summaries().items())
              + " (`max`: the best held-out accuracy; `last`: the last drift).", "",
              "Shares of floating-point comparisons (a greedy argmax, a sign, a clip bound): "
              + ", ".join(f"`{n}`" for n in sorted(thresholded()))
              + ". Where a compared value sits at a tie (a DPO margin of exactly 0 at policy == reference), runs "
              "whose floats differ in the last bits (other ranks, micro-batches or CPU kernels) count it one unit "
              "apart: compare such runs on the continuous metrics (`rewards/margins`, `loss/*`, `kl/*`).", ""]
    return "\n".join(lines)


PAGE = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else PAGE
    out.write_text(metrics_page(), encoding="utf-8")
    print(f"wrote {out}")
