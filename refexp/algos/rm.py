"""The reward-model stage (the root ``rm`` block): a reward model for the task, trained on samples of the start (SFT)
model, at one or several temperatures and optionally of policies (``refexp/algos/rm_sources.py``), labelled by the
task's verifier, cached under ``<cache>/rm/<hash>/`` like the SFT stage and exported as an HF
sequence-classification checkpoint (``<dir>/hf``) that ``task.reward_model`` loads (docs/reward-models.md).
``algo=rm`` runs only this stage; ``task.reward_model=rm`` finds it (or trains it) at a GRPO run's start.

The recipe is Cobbe et al. 2021's outcome verifier ("Training Verifiers to Solve Math Word Problems", §4): sample
completions of the training prompts from the generator, label each by whether its final answer is correct, and
train a scalar head on the generator's own backbone to predict that label. Here the backbone is the start model's
HF export loaded through transformers as ``AutoModelForSequenceClassification`` (e.g.
``LlamaForSequenceClassification``: the decoder plus a fresh linear ``score`` head on the last token), every
weight trained with binary cross-entropy on the logit (the verifier's label is the target, so the logit is the
log-odds that a completion is correct), or, with ``rm.loss=pairwise``, with the Bradley-Terry loss on the (right,
wrong) pairs of completions of one prompt: the order GRPO's within-prompt normalisation reads
(``refexp/algos/rm_pairs.py``).
``rm.num_samples`` sets how many labelled samples it sees: fewer make a weaker proxy for GRPO to exploit.

A share of the prompts (``rm.val_fraction``, with all their samples) is held out; the weights of the lowest held-out
loss (``bce``) or the highest held-out pair accuracy (``pairwise``) are kept, as the SFT stage keeps its
best-on-validation weights, and their held-out label accuracy is recorded with an interval over prompts
(``refexp/algos/rm_accuracy.py``), beside their within-prompt pair accuracy (``refexp/algos/rm_pairs.py``). The
task's test split is not read.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

from refexp.algos.rm_accuracy import prompt_interval
from refexp.algos.rm_pairs import by_prompt, pair_accuracy, pair_index, pairwise_loss
from refexp.algos.rm_sources import labelled_samples, policy_dirs
from refexp.algos.sft import read_sft_summary
from refexp.algos.start_key import start_in_key
from refexp.components.context import RunContext
from refexp.components.metric_logger import MetricLogger
from refexp.components.timing import now
from refexp.config import ConfigError
from refexp.config.diff import in_cache_terms
from refexp.record.atomic import atomic_dir, remove_temporaries, write_json_atomic
from refexp.record.cache_dirs import marker_check, verified_entry, write_entry_manifest
from refexp.record.hashing import stable_hash
from refexp.record.lock import FileLock
from refexp.record.metrics import read_metrics
from refexp.record.pins import content_hash
from refexp.tasks import task_fingerprint
from refexp.tasks.reward_model import (
    load_sequence_classifier,
    quiet_transformers,
    reward_model_inputs,
    reward_model_texts,
)

_rm_cached = marker_check("rm.json")
"""Whether a reward-model dir is complete (``rm.json`` is written last)."""


def start_hf_dir(sft_dir: Path) -> Path:
    """The HF export of the start model: the SFT stage's ``hf/``, or the start dir itself when it is an HF
    checkpoint (``sft.enable=false``); ConfigError when it has none."""
    for d in (Path(sft_dir) / "hf", Path(sft_dir)):
        if (d / "config.json").is_file():
            return d
    raise ConfigError(f"algo=rm needs an HF export of the start model: {sft_dir} has no config.json nor hf/ "
                      f"(sft.checkpoint=DIR must be an SFT output dir or an HF checkpoint)")


def rm_fingerprint(ctx: RunContext, sft_dir: Path) -> str:
    """Hash of what determines the reward model: the start model (its dir in the cache and what its ``sft.json``
    says), the task's data and verifier, the ``rm`` block (its temperatures, policies and loss among it), each policy's
    HF export and the sha256 of its weights (a policy re-exported under the same path is another proxy), the
    generation budget, the rollout engine and the clip (``training.max_norm``). Paths into the cache count by their
    place in it (``in_cache_terms``, ``start_in_key``), so a copied or moved cache keeps the key."""
    cfg, cache = ctx.cfg, ctx.cfg.sft.cache_dir
    policies = [{"dir": in_cache_terms(str(d), cache), "sha256": content_hash(d)} for d in policy_dirs(cfg.rm)]
    rm = in_cache_terms(asdict(cfg.rm), cache)
    if rm["loss"] == "bce":  # the default leaves the key of the models cached before rm.loss existed as it was
        del rm["loss"]
    else:  # pairwise keeps the step of the best held-out pair accuracy (_better)
        rm["kept_by"] = "val_pair_accuracy"
    key = {"start": start_in_key(cfg, sft_dir), "start_summary": read_sft_summary(sft_dir),
           "task": task_fingerprint(cfg.task, cache), "rm": rm, "policies": policies,
           "max_new_tokens": ctx.task.max_new_tokens, "rollout": asdict(cfg.rollout),
           "chat_template": cfg.task.chat_template, "max_norm": cfg.training.max_norm,
           "version": 2}  # 2: several sources, rm.json's per-source records and interval
    return stable_hash(key, 16)


def ensure_rm(ctx: RunContext, sft_dir: Path) -> Path:
    """The reward model's cache dir (``hf/``, ``metrics.jsonl``, ``rm.json``), trained now unless cached; one process
    trains it at a time (the SFT stage's lock and atomic rename)."""
    out = ctx.cache_dir / "rm" / rm_fingerprint(ctx, sft_dir)
    if _rm_cached(out):  # verified by its readers: run_rm, and RewardModel before it loads the weights
        return out
    if ctx.dist.world_size > 1:  # it trains in one process: the ranks would wait on each other's collectives
        raise ConfigError(f"task.reward_model=rm: the reward model of these settings is not in the cache ({out}), and "
                          f"it trains in one process: run `refexp algo=rm` with the same task, model, sft and rm "
                          f"settings once (one process), then this run")
    with FileLock(ctx.cache_dir / "rm" / f"{out.name}.lock", blocking=True):
        remove_temporaries(out)
        if not _rm_cached(out):
            with atomic_dir(out, is_complete=_rm_cached) as tmp:
                train_rm(ctx, sft_dir, Path(tmp))
                write_entry_manifest(tmp)  # last, before the rename publishes the entry
    return out


def run_rm(ctx: RunContext, sft_dir: Path) -> dict:
    """``algo=rm``: the reward model (cached or trained now), its curve logged to the run, its dir printed."""
    out = ensure_rm(ctx, sft_dir)
    verified_entry(out, "reward model")
    for row in read_metrics(out):  # the curve, also when it was cached
        ctx.logger.log({k: v for k, v in row.items() if k != "step"}, step=row["step"])
    summary = read_rm_summary(out)
    hf = out / "hf"
    if ctx.dist.is_rank0:
        print(f"[refexp] reward model: {hf} ({held_out_line(summary)}; {summary['train_samples']} training samples "
              f"from {len(summary['sources'])} source(s), {summary['positive_rate']:.3f} of all samples correct); "
              f"use it with task.reward_model={hf}")
    final = {"rm/val_accuracy": summary["val_accuracy"], "rm/val_loss": summary["val_loss"],
             "rm/positive_rate": summary["positive_rate"], "rm/dir": str(hf), "step": summary["steps"]}
    if summary.get("val_pair_accuracy") is not None:
        final["rm/val_pair_accuracy"] = summary["val_pair_accuracy"]
    return final


def held_out_line(summary: dict) -> str:
    """``rm.json``'s held-out accuracies in words, e.g. ``held-out label accuracy 0.812 [0.771, 0.853] (95%, over 64
    prompts; 256 samples); within-prompt pair accuracy 0.640 [0.571, 0.709] (95%, over prompts) over 212 pairs of 41
    prompts``."""
    ci = summary["val_accuracy_interval"]
    interval = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci is not None else ""
    pairs = ""
    if "val_pair_accuracy" in summary:  # absent from an rm.json written before it was recorded
        pair = summary["val_pair_accuracy"]
        pci = summary.get("val_pair_accuracy_interval")  # absent from an rm.json written before it was recorded
        pair_interval = f" [{pci[0]:.3f}, {pci[1]:.3f}] (95%, over prompts)" if pci is not None else ""
        pairs = (f"; within-prompt pair accuracy {pair:.3f}{pair_interval} over {summary['val_pairs']} pairs of "
                 f"{summary['val_pair_prompts']} prompts" if pair is not None else "; no within-prompt pairs")
    return (f"held-out label accuracy {summary['val_accuracy']:.3f}{interval} (95%, over {summary['val_prompts']} "
            f"prompts; {summary['val_samples']} samples){pairs}")


def read_rm_summary(rm_dir: Path) -> dict:
    """The ``rm.json`` a reward-model dir ends with (``train_rm``)."""
    return json.loads((Path(rm_dir) / "rm.json").read_text())


def _scores(model, tokenizer, texts: list[str], device) -> torch.Tensor:
    """The reward model's logit of each text [B] (float32)."""
    return model(**reward_model_inputs(tokenizer, texts, device)).logits[:, 0].float()


def _batch_loss(loss_name: str, logits: torch.Tensor, labels: torch.Tensor, prompt_ids: list) -> torch.Tensor:
    """``rm.loss`` of one batch: ``bce``, the binary cross-entropy of each logit [B] against its label [B];
    ``pairwise``, the Bradley-Terry loss over the batch's within-prompt (right, wrong) pairs (refexp/algos/rm_pairs.py;
    the batch holds at least one)."""
    if loss_name == "pairwise":
        return pairwise_loss(logits, *pair_index(labels.tolist(), prompt_ids))
    return F.binary_cross_entropy_with_logits(logits, labels.to(logits.device))


@torch.no_grad()
def _held_out(model, tokenizer, texts: list[str], labels: torch.Tensor, prompt_ids: list, device, batch_size: int,
              loss_name: str) -> tuple[dict[str, float], list[bool], dict]:
    """(``rm/val_loss`` (the mean ``rm.loss`` over the held-out samples, or over their pairs with ``pairwise``),
    ``rm/val_accuracy`` and ``rm/val_pair_accuracy`` when there are pairs; whether each sample's logit sign agrees
    with its label > 0.5 [N]; ``pair_accuracy``'s record of the held-out pairs)."""
    model.eval()
    logits = torch.cat([_scores(model, tokenizer, texts[s:s + batch_size], device).cpu()
                        for s in range(0, len(texts), batch_size)])
    model.train()
    right = ((logits > 0) == (labels > 0.5)).tolist()
    pairs = pair_accuracy(logits.tolist(), labels.tolist(), prompt_ids)
    row = {"rm/val_loss": float(_batch_loss(loss_name, logits, labels, prompt_ids)),
           "rm/val_accuracy": sum(right) / len(texts)}
    if pairs["accuracy"] is not None:
        row["rm/val_pair_accuracy"] = pairs["accuracy"]
    return row, right, pairs


def _better(loss_name: str, row: dict, best: dict) -> bool:
    """Whether this held-out measurement beats the kept one: with ``bce`` a lower held-out BCE; with ``pairwise`` a
    higher held-out pair accuracy (a lower Bradley-Terry loss on a tie). GRPO divides each group's rewards by their
    standard deviation (``group_advantages``, refexp/losses/grpo.py), so the scores' scale, which the Bradley-Terry
    loss also grades, is lost on it: only the order within a prompt reaches the policy."""
    if not math.isfinite(row["rm/val_loss"]):
        return False
    if loss_name == "pairwise":
        key = (row["rm/val_pair_accuracy"], -row["rm/val_loss"])
        return "rm/val_pair_accuracy" not in best or key > (best["rm/val_pair_accuracy"], -best["rm/val_loss"])
    return row["rm/val_loss"] < best["rm/val_loss"]


def _epochs(n: int, k: int, gen: torch.Generator):
    """Each step's ``k`` indices into ``range(n)``: epochs of a seeded permutation, one after another."""
    order: list[int] = []
    while True:
        if len(order) < k:
            order += torch.randperm(n, generator=gen).tolist()
        chosen, order = order[:k], order[k:]
        yield chosen


def _pair_batches(a, train: dict, gen: torch.Generator):
    """With ``rm.loss=pairwise``: each step's training-sample indices, the samples of ``rm.batch_size //
    rm.samples_per_prompt`` (at least 1) prompts drawn (epochs of a seeded permutation) from the training prompts
    that have a right and a wrong sample; every pair of theirs is in the step's loss. ConfigError when no training
    prompt has one."""
    groups = by_prompt(range(len(train["labels"])), train["labels"].tolist(), train["prompt_ids"])
    usable = [sorted(rs + ws) for rs, ws in groups.values() if rs and ws]  # each prompt's samples in their order
    if not usable:
        raise ConfigError(f"rm.loss=pairwise: none of the {len(groups)} training prompts has both a right and a "
                          f"wrong sample among its rm.samples_per_prompt={a.samples_per_prompt}: raise "
                          f"rm.samples_per_prompt or rm.num_samples, sample hotter (rm.temperatures), or use "
                          f"rm.loss=bce")
    for chosen in _epochs(len(usable), max(1, a.batch_size // a.samples_per_prompt), gen):
        yield [i for c in chosen for i in usable[c]]


def _sample_batches(a, train: dict, gen: torch.Generator):
    """With ``rm.loss=bce``: each step's ``rm.batch_size`` training-sample indices (epochs of a seeded
    permutation)."""
    yield from _epochs(len(train["labels"]), a.batch_size, gen)


def train_rm(ctx: RunContext, sft_dir: Path, out_dir: Path) -> dict:
    """Sample and label, train the reward model on ``ctx.device``, keep its best held-out weights and write
    ``out_dir/hf`` (safetensors, config.json with one label, tokenizer), ``metrics.jsonl`` and ``rm.json`` (last)."""
    cfg, a, device = ctx.cfg, ctx.cfg.rm, ctx.device
    t0 = now(device)
    out_dir.mkdir(parents=True, exist_ok=True)
    train, val, per_source = labelled_samples(ctx, sft_dir)
    torch.manual_seed(a.seed)  # the fresh score head
    model, tokenizer = load_sequence_classifier(str(start_hf_dir(sft_dir)), torch.float32, device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    def render(d):
        return reward_model_texts(tokenizer, d["prompts"], d["completions"], prompts_rendered=cfg.task.chat_template)

    train_texts, val_texts = render(train), render(val)
    log = MetricLogger(out_dir, enabled=True)
    positive_rate = float(torch.cat([train["labels"], val["labels"]]).mean())
    best = {"rm/val_loss": math.inf}
    best_state, best_step, best_right, best_pairs = None, 0, [], {"accuracy": None, "interval": None, "pairs": 0,
                                                                  "prompts": 0}
    val_losses: list[float] = []
    gen = torch.Generator().manual_seed(a.seed)
    if a.loss == "pairwise":
        _, held_right = pair_index(val["labels"].tolist(), val["prompt_ids"])
        if len(held_right) == 0:  # nothing to keep the best step by
            raise ConfigError(f"rm.loss=pairwise: none of the {len(set(val['prompt_ids']))} held-out prompts has "
                              f"both a right and a wrong sample: raise rm.val_fraction, rm.samples_per_prompt or "
                              f"rm.num_samples")
    batches = (_pair_batches if a.loss == "pairwise" else _sample_batches)(a, train, gen)
    for step in range(1, a.steps + 1):
        ids = next(batches)
        logits = _scores(model, tokenizer, [train_texts[i] for i in ids], device)
        loss = _batch_loss(a.loss, logits, train["labels"][ids], [train["prompt_ids"][i] for i in ids])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.training.max_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        row = {"rm/loss": float(loss.detach())}
        if step == 1:
            row["rm/positive_rate"] = positive_rate
        if step % a.eval_every == 0 or step == a.steps:
            measured, right, pairs = _held_out(model, tokenizer, val_texts, val["labels"], val["prompt_ids"], device,
                                               a.batch_size, a.loss)
            row.update(measured)
            if _better(a.loss, row, best):
                best, best_step, best_right, best_pairs = dict(row), step, right, pairs
                best_state = copy.deepcopy({k: v.detach().cpu() for k, v in model.state_dict().items()})
        log.log(row, step=step)
        if "rm/val_loss" in row:
            val_losses.append(row["rm/val_loss"])
    if best_state is None:  # every held-out loss NaN or infinite: nothing to keep
        log.close()
        raise ConfigError(f"algo=rm: no held-out evaluation of the reward model gave a finite loss (rm/val_loss "
                          f"{', '.join(f'{v:g}' for v in val_losses)}): its training diverged; lower rm.lr={a.lr:g}")
    model.load_state_dict(best_state)
    with quiet_transformers():
        model.save_pretrained(out_dir / "hf")  # safetensors, config.json (one label, pad id)
    tokenizer.save_pretrained(out_dir / "hf")
    held_out = prompt_interval(best_right, val["prompt_ids"])
    for si, record in enumerate(per_source):  # each source's share of the held-out samples, at the kept step
        mine = [i for i, s in enumerate(val["sources"]) if s == si]
        record["val_accuracy"] = prompt_interval([best_right[i] for i in mine],
                                                 [val["prompt_ids"][i] for i in mine])["accuracy"]
    summary = {"steps": a.steps, "kept_step": best_step, "val_loss": best["rm/val_loss"],
               "val_accuracy": held_out["accuracy"], "val_accuracy_interval": held_out["interval"],
               "val_prompts": held_out["prompts"], "loss": a.loss, "val_pair_accuracy": best_pairs["accuracy"],
               "val_pair_accuracy_interval": best_pairs["interval"],
               "val_pairs": best_pairs["pairs"], "val_pair_prompts": best_pairs["prompts"],
               "train_samples": len(train_texts),
               "val_samples": len(val_texts), "positive_rate": positive_rate, "sources": per_source,
               "wall_s": now(device) - t0, "start": str(sft_dir)}
    log.close()
    write_json_atomic(out_dir / "rm.json", summary)
    return summary

