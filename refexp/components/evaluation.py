"""Held-out measurements made the same way for every algorithm and strategy: ``eval/accuracy``, ``val/accuracy``,
``eval/retention``, ``val/retention``, ``eval/pass_at_k``, ``eval/gold``, ``val/gold``, ``kl/init``, ``kl/init_retain``,
``kl/init_exact``, ``kl/init_exact_retain``, DPO's ``kl/ref`` and ``eval/logp_correct``. What each means, on which
prompts and when it is logged: docs/metrics.md (generated from ``refexp/record/metric_names.py``).

The held-out rows are split over the data-parallel ranks (``distributed.padded_share``: contiguous
blocks, padded so that every rank makes the same sharded forward calls; the padding's results are
dropped), and each number is an exact sum over ranks (rewards, tokens, token-weighted KL, log-probs;
``dp_sum``) divided by a global count, so it does not depend on the world size. A sampled completion
is keyed by its prompt's index, so it is the same whichever rank draws it.

``evaluate`` makes them for the RL loop; ``InitAnchor`` (``refexp/reference/anchor.py``) is the initial model
``kl/init`` is measured against.
"""

from __future__ import annotations

import gc
from contextlib import ExitStack, contextmanager
from typing import Callable, Mapping

import torch

from refexp import titan
from refexp.components.context import RunContext
from refexp.components.rollout import BuiltinEngine, RolloutEngine, build_engine, decode_capacity
from refexp.losses.kl import masked_sum, sequence_kl
from refexp.record.metric_names import (
    EVAL_ACCURACY,
    EVAL_GOLD,
    EVAL_PASS_AT_K,
    EVAL_RETENTION,
    KL_INIT,
    KL_INIT_EXACT,
    KL_INIT_EXACT_RETAIN,
    KL_INIT_RETAIN,
    VAL_ACCURACY,
    VAL_GOLD,
    VAL_RETENTION,
)
from refexp.record.outcomes import EvalOutcomes
from refexp.reference.anchor import InitAnchor
from refexp.reference.offload import model_device
from refexp.reference.strategies import ReferenceStrategy
from refexp.runtime.distributed import dp_sum, padded_share
from refexp.tasks.batching import pack_sequences

EVAL_SAMPLES = "samples/eval"
"""The metrics key of an evaluation's sample completions (a list of dicts; ``MetricLogger`` turns it into
``samples.jsonl`` rows and a W&B table, never a number)."""
EVAL_OUTCOMES, VAL_OUTCOMES = "outcomes/eval", "outcomes/val"
OUTCOMES = {EVAL_ACCURACY: EVAL_OUTCOMES, VAL_ACCURACY: VAL_OUTCOMES, EVAL_RETENTION: "outcomes/retain_eval",
            VAL_RETENTION: "outcomes/retain_val", EVAL_PASS_AT_K: "outcomes/pass_at_k", KL_INIT: "outcomes/kl_init",
            KL_INIT_RETAIN: "outcomes/kl_init_retain", KL_INIT_EXACT: "outcomes/kl_init_exact",
            KL_INIT_EXACT_RETAIN: "outcomes/kl_init_exact_retain"}
"""The metrics keys of an evaluation's per-prompt scores, by metric (``EvalOutcomes``; ``MetricLogger`` writes
them to ``eval_outcomes.jsonl`` only: not a metric, not sent to W&B)."""
EVAL_GOLD_OUTCOMES, VAL_GOLD_OUTCOMES = "outcomes/eval_gold", "outcomes/val_gold"
"""The same for the gold reward beside a learned one (``eval/gold``, ``val/gold``)."""
GOLD = {EVAL_ACCURACY: (EVAL_GOLD, EVAL_GOLD_OUTCOMES), VAL_ACCURACY: (VAL_GOLD, VAL_GOLD_OUTCOMES)}
"""The gold metric (and its outcomes key) logged beside an optimised-reward accuracy."""
KL_INIT_KEY = 7_777  # a key namespace distinct from training rollouts
PASS_K_KEY = 7_778  # eval/pass_at_k's samples: another namespace (3-tuple keys, as kl/init's)
GREEDY_METRICS = ((EVAL_ACCURACY, "eval"), (VAL_ACCURACY, "val"), (EVAL_RETENTION, "retain_eval"),
                  (VAL_RETENTION, "retain_val"))
"""The greedy exact-match metrics of ``evaluate`` and the ``Task`` split each reads (its outcomes' ``split``)."""

EVAL_BATCH_SIZE = 256
"""Rows an evaluation decodes or scores at once on a rank (its ``ceil(n / dp)`` prompts in batches of at most this):
the functions' default, and what the memory plan counts (``refexp/cli/memory_plan.py``)."""

LogprobFn = Callable[..., torch.Tensor]
"""``fn(tokens_BT, **kwargs) -> [B, T-1]`` float32 log-probs; kwargs go to ``titan.token_logprobs``
(``temperature``, ``positions_BT``, ``allowed_BTT``)."""


def _batches(n: int, size: int):
    for s in range(0, n, size):
        yield slice(s, min(n, s + size))


def _real_rows(sl: slice, real: int) -> torch.Tensor:
    """[len(sl)] bool: which rows of a batch of this rank's ``padded_share`` ids are real, not padding."""
    return torch.arange(sl.start, sl.stop) < real


def _global_sums(parallel_dims, device: torch.device, *values: float) -> list[float]:
    """Per-rank sums added over the data-parallel ranks, in float64 on ``device`` (the collective's: NCCL
    reduces only CUDA tensors)."""
    return dp_sum(parallel_dims, torch.tensor(values, dtype=torch.float64, device=device)).tolist()


def _all_scores(parallel_dims, device: torch.device, ids: list[int], mine: list[float], n: int) -> list[float]:
    """[n] every prompt's score, on every rank, from each rank's scores ``mine`` of its first ``len(mine)``
    ``ids`` (one rank holds each prompt: the others add an exact 0)."""
    out = torch.zeros(n, dtype=torch.float64, device=device)
    out[torch.tensor(ids[:len(mine)], dtype=torch.long, device=device)] = torch.tensor(
        mine, dtype=torch.float64, device=device)
    return dp_sum(parallel_dims, out).tolist()


@torch.no_grad()
def greedy_accuracy(model, task, num_prompts: int, *, batch_size: int = EVAL_BATCH_SIZE, parallel_dims=None,
                    split: str = "eval", samples: list | None = None, num_samples: int = 0,
                    engine: RolloutEngine | None = None, scores: list | None = None,
                    gold_scores: list | None = None, verifier: bool = False) -> float:
    """Mean reward of greedy completions on the first ``num_prompts`` prompts of ``task.<split>`` (the
    held-out ``eval`` prompts, or ``val``), split over the data-parallel ranks of ``parallel_dims`` (None:
    this process does them all). Collective. ``samples``: a list that receives the first ``num_samples``
    rows this rank measured as ``{"prompt", "completion", "answer", "reward"}`` (rank 0 holds the first
    prompts, and only rank 0 logs). ``engine``: the rollout engine that generates (None: the built-in one
    on ``model``). ``scores``: a list that receives the score of each of the ``num_prompts`` prompts, in
    order, on every rank (one more collective). ``gold_scores``: the same for the task's gold reward
    (``Task.gold_score``; left empty when the task logs none). ``verifier``: score with the task's verifier
    (``Task.verify``, what the SFT stage reads) instead of the optimised reward."""
    engine = engine or BuiltinEngine(model, task.tokenizer)
    data = getattr(task, split)
    n = min(num_prompts, len(data))
    ids, real = padded_share(parallel_dims, n)
    rows = data.select(ids)
    prompts, answers = rows["prompt"], rows["answer"]
    total = 0.0
    mine: list[float] = []  # this rank's real prompts' scores, in order
    mine_gold: list[float] = []
    score = task.verify if verifier else task.score
    with_gold = gold_scores is not None and getattr(task, "gold", None) is not None
    was_training = model.training
    model.eval()
    for sl in _batches(len(prompts), batch_size):
        out = engine.generate(prompts[sl], max_new_tokens=task.max_new_tokens, greedy=True)
        batch_scores = score(out.texts, answers[sl], prompts[sl])
        real_rows = _real_rows(sl, real).tolist()
        kept = [s for s, keep in zip(batch_scores, real_rows) if keep]
        total += sum(kept)
        mine += [float(s) for s in kept]
        if with_gold:
            mine_gold += [float(g) for g, keep in zip(task.gold_score(out.texts, answers[sl], prompts[sl]), real_rows)
                          if keep]
        if samples is not None:
            keep = max(0, min(num_samples - len(samples), real - sl.start, len(batch_scores)))
            samples += [{"prompt": p, "completion": c, "answer": a, "reward": float(r)} for p, c, a, r
                        in zip(prompts[sl][:keep], out.texts[:keep], answers[sl][:keep], batch_scores[:keep])]
    model.train(was_training)
    (total,) = _global_sums(parallel_dims, model_device(model), total)
    if scores is not None:
        scores += _all_scores(parallel_dims, model_device(model), ids, mine, n)
    if with_gold:
        gold_scores += _all_scores(parallel_dims, model_device(model), ids, mine_gold, n)
    return total / max(1, n)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one prompt from n samples of which c are correct (Chen et al. 2021, eq. 1):
    1 - C(n-c, k) / C(n, k), as their numerically stable product 1 - prod_{i=n-c+1}^{n} (1 - k/i)."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 < k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


@torch.no_grad()
def sampled_pass_at_k(model, task, num_prompts: int, *, k: int, n: int, seed: int, temperature: float = 1.0,
                      top_p: float = 1.0, batch_size: int = EVAL_BATCH_SIZE, parallel_dims=None,
                      engine: RolloutEngine | None = None, scores: list | None = None) -> float:
    """Mean ``pass_at_k(n, c, k)`` over the first ``num_prompts`` held-out prompts, n completions each sampled by
    ``engine`` (None: the built-in one on ``model``) with keys ``(seed, PASS_K_KEY, prompt index * n + sample)``, c the
    completions the task's verifier scores >= 1. Split over the data-parallel ranks as ``greedy_accuracy``; ``scores``
    receives every prompt's estimate, in order, on every rank. Collective."""
    engine = engine or BuiltinEngine(model, task.tokenizer)
    total_n = min(num_prompts, len(task.eval))
    ids, real = padded_share(parallel_dims, total_n)
    rows = task.eval.select(ids)
    prompts, answers = rows["prompt"], rows["answer"]
    mine: list[float] = []
    was_training = model.training
    model.eval()
    for sl in _batches(len(prompts), max(1, batch_size // n)):
        group = [p for p in prompts[sl] for _ in range(n)]
        keys = [(seed, PASS_K_KEY, i * n + j) for i in ids[sl] for j in range(n)]  # not a training key's shape
        out = engine.generate(group, max_new_tokens=task.max_new_tokens, temperature=temperature, top_p=top_p,
                              keys=keys)
        # correct by the verifier, also beside a learned reward (whose score is not a correctness)
        rewards = task.verify(out.texts, [a for a in answers[sl] for _ in range(n)], group)
        for row, keep in enumerate(_real_rows(sl, real).tolist()):
            if keep:
                correct = sum(r >= 1.0 for r in rewards[row * n:(row + 1) * n])
                mine.append(pass_at_k(n, correct, k))
    model.train(was_training)
    (total,) = _global_sums(parallel_dims, model_device(model), sum(mine))
    if scores is not None:
        scores += _all_scores(parallel_dims, model_device(model), ids, mine, total_n)
    return total / max(1, total_n)


def kl_sample_key(seed: int, prompt: int, sample: int) -> tuple[int, ...]:
    """The sampling key of the drift's completion ``sample`` of held-out prompt ``prompt``: the first is
    ``(seed, KL_INIT_KEY, prompt)``, the one sample a run with ``eval.kl_samples=1`` draws; the others
    ``(seed, -KL_INIT_KEY, prompt, sample)``, a training key's shape (seed, step, prompt, sample) with a negative
    step, which no training step has."""
    return (seed, KL_INIT_KEY, prompt) if sample == 0 else (seed, -KL_INIT_KEY, prompt, sample)


@torch.no_grad()
def kl_to_anchor(policy, anchors: Mapping[str, LogprobFn], task, num_prompts: int, *,
                 seed: int, temperature: float = 1.0, batch_size: int = EVAL_BATCH_SIZE, parallel_dims=None,
                 engine: RolloutEngine | None = None, split: str = "eval",
                 per_prompt: dict[str, list[float]] | None = None,
                 exact: Mapping[str, torch.nn.Module] | None = None, samples: int = 1) -> dict[str, float]:
    """Mean per-token k3 KL(policy || anchor) for every ``name -> fn`` of ``anchors``, and the mean per-token exact
    KL(policy || model) (each position's KL summed over the vocabulary, ``titan.token_kl``) for every
    ``name -> model`` of ``exact``, over one set of completions sampled from the policy (by ``engine``, None: the
    built-in one on ``policy``), ``samples`` per prompt (keys ``kl_sample_key``), on the first ``num_prompts`` rows of
    ``task.<split>``: ``{name: kl}``. Each ``fn`` is called with ``temperature=``, and each exact model's
    distributions are tempered so, like the policy's. The prompts are split over the data-parallel ranks of
    ``parallel_dims`` (None: this process does them all). ``per_prompt`` receives, for every name, each prompt's
    linearised contribution (``kl_influence``, its samples' KL and tokens summed), in order, on every rank.
    Collective."""
    engine = engine or BuiltinEngine(policy, task.tokenizer)
    exact = exact or {}
    data = getattr(task, split)
    n = min(num_prompts, len(data))
    ids, real = padded_share(parallel_dims, n)
    prompts = data.select(ids)["prompt"]
    names = [*anchors, *exact]
    kl_sum, tok_sum = dict.fromkeys(names, 0.0), 0
    mine_kl: dict[str, list[float]] = {name: [] for name in names}  # this rank's real prompts, in order
    mine_tok: list[float] = []
    for sl in _batches(len(prompts), max(1, batch_size // samples)):
        group = [p for p in prompts[sl] for _ in range(samples)]
        keys = [kl_sample_key(seed, i, j) for i in ids[sl] for j in range(samples)]  # the same sample on any rank
        r = engine.generate(group, max_new_tokens=task.max_new_tokens, temperature=temperature, keys=keys)
        # the output layer only at completion tokens (``select_BT``): the KL reads no others
        pol = titan.token_logprobs(policy, r.tokens_BT, temperature=temperature, select_BT=r.mask_BT)
        keep = _real_rows(sl, real).to(r.mask_BT.device)  # [prompts]
        mask = r.mask_BT & keep.repeat_interleave(samples)[:, None]
        kl_B = {name: sequence_kl(pol, fn(r.tokens_BT, temperature=temperature, select_BT=r.mask_BT), mask)
                for name, fn in anchors.items()}
        for name, model in exact.items():
            kl_BT = titan.token_kl(policy, model, r.tokens_BT, select_BT=r.mask_BT, temperature=temperature)
            kl_B[name] = masked_sum(kl_BT, mask, dim=-1)
        for name in names:
            # summed in float64, as the per-prompt scores are: the metric is their mean to ~1e-15, not to float32's 1e-7
            kl_sum[name] += float(kl_B[name].double().sum())
            mine_kl[name] += kl_B[name].view(-1, samples).sum(-1)[keep].tolist()  # a prompt: its samples' sum
        tok_sum += int(mask.sum())
        mine_tok += mask.sum(-1).view(-1, samples).sum(-1)[keep].tolist()
    *kl_sums, tok_sum = _global_sums(parallel_dims, model_device(policy), *kl_sum.values(), tok_sum)
    out = {name: s / max(1, tok_sum) for name, s in zip(kl_sum, kl_sums)}
    if per_prompt is not None:
        device = model_device(policy)
        tokens = _all_scores(parallel_dims, device, ids, mine_tok, n)
        for name in names:
            per_prompt[name] = kl_influence(_all_scores(parallel_dims, device, ids, mine_kl[name], n), tokens)
    return out


def kl_influence(kl: list[float], tokens: list[float]) -> list[float]:
    """Each prompt's linearised contribution to the token-weighted mean R = sum(kl) / sum(tokens) (``kl`` [n]: the
    prompt's summed KL, ``tokens`` [n]: its completion tokens): R + (kl_i - R tokens_i) / mean(tokens). Their mean
    is R exactly, and the mean of a resample of them varies as the ratio estimator does to first order (its
    delta-method variance: Cochran 1977, "Sampling Techniques", §6.4), so a report can resample a run's drift
    prompt by prompt like any per-prompt score."""
    total = sum(tokens)
    if not kl or total <= 0:
        return [0.0] * len(kl)
    ratio, mean_tok = sum(kl) / total, total / len(tokens)
    return [ratio + (k - ratio * t) / mean_tok for k, t in zip(kl, tokens)]


@torch.inference_mode()
def logp_correct(policy, task, num_prompts: int, *, batch_size: int = EVAL_BATCH_SIZE, parallel_dims=None,
                 split: str = "eval", per_token: bool = False) -> float:
    """Mean over the first ``num_prompts`` rows of ``task.<split>`` of the policy's summed log-prob of the
    row's reference ``completion`` + EOS (packed as SFT's targets, refexp/algos/sft.py); ``per_token``: the
    mean over those completion tokens instead (minus SFT's loss on them). The rows are split over the
    data-parallel ranks of ``parallel_dims`` (None: this process does them all). Collective."""
    data = getattr(task, split)
    n = min(num_prompts, len(data))
    ids, real = padded_share(parallel_dims, n)
    rows = data.select(ids)
    device = next(policy.parameters()).device
    total, tokens_total = 0.0, 0
    for sl in _batches(len(rows), batch_size):
        tokens, completion = pack_sequences(task.tokenizer, rows["prompt"][sl], rows["completion"][sl], add_eos=True)
        mask = completion[:, 1:].to(device)  # completion token t+1 is predicted at log-prob column t
        logp = titan.token_logprobs(policy, tokens.to(device), select_BT=mask)
        keep = _real_rows(sl, real).to(device)
        total += float(masked_sum(logp, mask, dim=-1)[keep].sum())
        tokens_total += int(mask[keep].sum())
    total, tokens_total = _global_sums(parallel_dims, device, total, tokens_total)
    return total / max(1, tokens_total if per_token else n)


@contextmanager
def reference_logprobs(strategy: ReferenceStrategy):
    """``with reference_logprobs(strategy) as fn:`` the strategy's log-prob function (``fn`` as
    ``InitAnchor.logprobs``'). A fixed reference whose model was released (DPO's precomputed table,
    refexp/algos/dpo_reference.py ``build_ref_source``) is built for the measurement and released after it."""
    built = strategy.model is None
    if built:
        strategy.ensure_model()
    try:
        yield strategy.logprobs
    finally:
        if built:
            strategy.release_model()
            gc.collect()


def _kl_outcomes(split: str, metric: str, scores: list[float]) -> EvalOutcomes:
    """A KL's per-prompt linearised contributions (``kl_influence``) as outcomes: their mean is the metric."""
    return EvalOutcomes(split, metric, list(range(len(scores))), scores)


def evaluate(ctx: RunContext, policy: torch.nn.Module, anchor: InitAnchor, *,
             reference: ReferenceStrategy | None = None, with_logp_correct: bool = False,
             with_accuracy: bool = True) -> dict[str, float]:
    """``eval/accuracy`` (unless not ``with_accuracy``: a task without a reward) and ``kl/init`` of
    ``policy`` with the run's ``eval`` settings; with a ``reference`` that holds a model also ``kl/ref``
    on the same samples, and ``eval/logp_correct`` when ``with_logp_correct``."""
    ecfg = ctx.cfg.eval
    temperature = getattr(ctx.cfg.algo, "temperature", 1.0)  # GRPO samples at algo.temperature; DPO has none
    pd = ctx.parallel_dims
    engine = build_engine(ctx.cfg.rollout, policy, ctx.task.tokenizer, capacity=decode_capacity(ctx.cfg))
    out = {}
    if with_accuracy:
        for metric, split in GREEDY_METRICS:  # a split the task lacks (no validation, no retained skill): skipped
            data = getattr(ctx.task, split)
            if data is None or not len(data):
                continue
            samples: list[dict] = []
            scores: list[float] = []
            gold: list[float] = []  # beside a learned reward: the gold reward of the same completions
            retention = metric not in GOLD  # exact match on a skill no reward trains: the verifier's
            out[metric] = greedy_accuracy(policy, ctx.task, ecfg.num_prompts, parallel_dims=pd, split=split,
                                          samples=samples if metric == EVAL_ACCURACY else None,
                                          num_samples=ecfg.log_samples, engine=engine, scores=scores,
                                          gold_scores=None if retention else gold, verifier=retention)
            out[OUTCOMES[metric]] = EvalOutcomes(split, metric, list(range(len(scores))), scores)
            if gold:
                gold_metric, gold_key = GOLD[metric]
                out[gold_metric] = sum(gold) / len(gold)
                out[gold_key] = EvalOutcomes(split, gold_metric, list(range(len(gold))), gold)
            if samples:
                out[EVAL_SAMPLES] = samples  # the logger writes them to samples.jsonl and a W&B table
        if ecfg.pass_k:
            scores = []
            out[EVAL_PASS_AT_K] = sampled_pass_at_k(
                policy, ctx.task, ecfg.pass_k_prompts, k=ecfg.pass_k, n=ecfg.pass_k_n(), seed=ctx.cfg.training.seed,
                temperature=temperature, top_p=getattr(ctx.cfg.algo, "top_p", 1.0), parallel_dims=pd, engine=engine,
                scores=scores)
            out[OUTCOMES[EVAL_PASS_AT_K]] = EvalOutcomes("eval", EVAL_PASS_AT_K, list(range(len(scores))), scores)
    measure_ref = reference is not None and reference.holds_model
    # the fixed reference on the start checkpoint is the anchor (InitAnchor.shared): its kl/ref is kl/init
    ref_is_anchor = measure_ref and reference is anchor.shared
    with ExitStack() as stack:
        init = stack.enter_context(anchor.logprobs())
        init_model = stack.enter_context(anchor.frozen())  # the same lending: kl/init_exact reads whole distributions
        fns = {KL_INIT: init}
        if measure_ref and not ref_is_anchor:
            fns["kl/ref"] = stack.enter_context(reference_logprobs(reference))
        drift = dict(seed=ctx.cfg.training.seed, temperature=temperature, parallel_dims=pd, engine=engine,
                     samples=ecfg.kl_samples)
        per_prompt: dict[str, list[float]] = {}
        out.update(kl_to_anchor(policy, fns, ctx.task, ecfg.kl_prompts, per_prompt=per_prompt,
                                exact={KL_INIT_EXACT: init_model}, **drift))
        for metric in (KL_INIT, KL_INIT_EXACT):
            out[OUTCOMES[metric]] = _kl_outcomes("eval", metric, per_prompt[metric])
        retain = getattr(ctx.task, "retain_eval", None)
        if retain is not None and len(retain):  # the skill RL does not sample: drift where no reward pulls
            per_prompt = {}
            out.update(kl_to_anchor(policy, {KL_INIT_RETAIN: init}, ctx.task, ecfg.kl_prompts, split="retain_eval",
                                    per_prompt=per_prompt, exact={KL_INIT_EXACT_RETAIN: init_model}, **drift))
            for metric in (KL_INIT_RETAIN, KL_INIT_EXACT_RETAIN):
                out[OUTCOMES[metric]] = _kl_outcomes("retain_eval", metric, per_prompt[metric])
    if ref_is_anchor:
        out["kl/ref"] = out["kl/init"]
    if with_logp_correct:
        out["eval/logp_correct"] = logp_correct(policy, ctx.task, ecfg.kl_prompts, parallel_dims=pd)
    return out
