"""The SFT stage: the model every RL run starts from and that ``reference=fixed`` keeps, trained on the task's
demonstrations until the validation loss plateaus (or the accuracy target, or the step cap) and cached under
``<cache>/sft/<hash>/``. Stop rules, cache layout and locking: docs/algorithms.md, "The SFT stage".
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path

import torch

from refexp import titan
from refexp.algos.sft_checks import START_BAND, converged, start_warnings
from refexp.components.context import RunContext
from refexp.components.data_order import batch_ids
from refexp.components.evaluation import greedy_accuracy, logp_correct
from refexp.components.metric_logger import MetricLogger
from refexp.components.models import build_run_model
from refexp.components.optim import build_optimizer, clip_and_step
from refexp.components.progress import progress_bar
from refexp.components.rollout import build_engine, decode_capacity
from refexp.components.timing import now
from refexp.config.diff import in_cache_terms
from refexp.config.model import model_identity
from refexp.losses import sft_loss
from refexp.record.atomic import atomic_dir, remove_temporaries, write_json_atomic
from refexp.record.cache_dirs import manifest_path, marker_check, verified_entry, write_entry_manifest
from refexp.record.hashing import stable_hash
from refexp.record.lock import FileLock
from refexp.record.metric_names import EVAL_ACCURACY, EVAL_RETENTION
from refexp.runtime import distributed as rdist
from refexp.tasks import task_fingerprint
from refexp.tasks.arithmetic import imitation_ceiling
from refexp.tasks.batching import pack_sequences
from refexp.tasks.data_checks import SFT_STAGE, check_targets
from refexp.titan import save_model_weights


def sft_fingerprint(ctx: RunContext) -> str:
    """Hash of what determines the SFT model: model shape, task data, the sft block, dtypes, and how many
    validation prompts its stop rules read (``eval.num_prompts``). A path into the cache (``model.pretrained``'s
    ``model.hf_assets_path``) counts by its place in it (``in_cache_terms``): a copied or moved cache keeps the key."""
    cfg = ctx.cfg
    cache = cfg.sft.cache_dir
    # enable is always true here; leaving it out keeps the keys of caches made before it existed.
    sft = {k: v for k, v in asdict(cfg.sft).items() if k not in ("cache_dir", "checkpoint", "enable")}
    key = {"model": in_cache_terms(model_identity(cfg.model), cache), "task": task_fingerprint(cfg.task, cache),
           "sft": in_cache_terms(sft, cache), "dtype": cfg.training.dtype,
           "vocab": ctx.task.tokenizer.vocab_size, "version": 2,  # 2: the plateau rule waits for the accuracy floor
           # the stop rules read this many validation prompts
           "val_prompts": cfg.eval.num_prompts}
    compute = cfg.training.compute_dtype(ctx.device.type)
    if compute != "float32":  # bf16 compute trains another model; float32 keys stay those of older caches
        key["compute_dtype"] = compute
    return stable_hash(key, 16)


def ensure_sft(ctx: RunContext) -> Path:
    """The dir the RL stage starts from: ``model.hf_assets_path`` when ``sft.enable=false`` (a pretrained
    HF checkpoint; ``titan.load_weights`` recognises it), ``sft.checkpoint`` if given, else the SFT
    output, cached or trained now."""
    if not ctx.cfg.sft.enable:  # RootConfig's checks guarantee hf_assets_path is set
        return Path(ctx.cfg.model.hf_assets_path)
    if ctx.cfg.sft.checkpoint:  # a directory: config.check_start_weights
        start = Path(ctx.cfg.sft.checkpoint)
        if rdist.decided_by_rank0(lambda: manifest_path(start).is_file()):  # a copied cache entry: still whole?
            rdist.decided_by_rank0(lambda: verified_entry(start, "SFT model"))
        return start
    check_targets(ctx.cfg.task, ctx.task.demonstrations, [SFT_STAGE])  # also checked before any model is fetched

    def look() -> tuple[Path, bool]:  # the key holds the data files' times: rank 0's view of both (NFS)
        out = ctx.cache_dir / "sft" / sft_fingerprint(ctx)
        return out, _sft_cached(out)

    out, cached = rdist.decided_by_rank0(look)
    if cached:
        rdist.decided_by_rank0(lambda: verified_entry(out, "SFT model"))
        return out
    # Rank 0 takes the cross-process lock; all ranks then agree on whether training is needed.
    # (a job that finds it held waits for the holder's model; refexp/record/lock.py, also without flock)
    lock = FileLock(ctx.cache_dir / "sft" / f"{out.name}.lock", blocking=True) if ctx.dist.is_rank0 else nullcontext()
    with lock:
        if ctx.dist.is_rank0:
            remove_temporaries(out)  # left by a run killed while training this model; the lock excludes live ones
        if rdist.broadcast_object(not _sft_cached(out)):
            # rank 0 makes the temp dir and renames it into place; every rank trains into it
            with (atomic_dir(out, is_complete=_sft_cached) if ctx.dist.is_rank0 else nullcontext()) as tmp:
                tmp = Path(rdist.broadcast_object(str(tmp) if tmp is not None else None))
                train_sft(ctx, tmp)
                rdist.barrier()  # every rank's files are written before rank 0 lists them
                if ctx.dist.is_rank0:
                    write_entry_manifest(tmp)  # last, before the rename publishes the entry
            rdist.barrier()
        else:  # made by the job that held the lock while this one waited
            rdist.decided_by_rank0(lambda: verified_entry(out, "SFT model"))
    return out


_sft_cached = marker_check("sft.json")
"""Whether an SFT output dir is complete (``sft.json`` is written last)."""


def read_sft_summary(sft_dir: Path) -> dict:
    """The ``sft.json`` an SFT output dir ends with (``_save_sft_output``); {} for a start that is not one
    (``sft.enable=false``: a pretrained checkpoint)."""
    summary_file = Path(sft_dir) / "sft.json"
    return json.loads(summary_file.read_text()) if summary_file.is_file() else {}


def sft_batch(ctx: RunContext, step: int) -> list[int]:
    """This rank's rows of the global SFT batch of ``step`` (``refexp.components.data_order``, keyed by
    ``sft.seed``)."""
    b = ctx.cfg.sft.batch_size
    return batch_ids(len(ctx.task.demonstrations), b, ctx.cfg.sft.seed, step)[rdist.local_slice(ctx.parallel_dims, b)]


class ValidationStop:
    """The SFT stage's stop rules, fed validation measurements only: ``done`` once the accuracy reaches
    ``sft.target_accuracy``, or (from ``sft.min_steps`` on, and once the accuracy has reached ``accuracy_floor``)
    after ``sft.patience`` evaluations in a row whose loss is not below the best so far by ``sft.min_delta``.
    Without a validation split it never stops the stage (the step cap does).

    ``accuracy_floor``: the least validation accuracy a converged model of the task has (the embedded task's
    ``imitation_ceiling`` less ``START_BAND``; None where the task has no such number). On the embedded task the
    loss creeps along a plateau for 500 to 2,500 steps, depending on the seed, before the accuracy jumps
    (docs/headroom-task.md, "Why the SFT stage waits"); a loss plateau below the floor is that wait, not
    convergence."""

    def __init__(self, sft, *, has_val: bool, accuracy_floor: float | None = None) -> None:
        self.sft, self.has_val, self.accuracy_floor = sft, has_val, accuracy_floor
        self.best_loss: float | None = None
        self.accuracy: float | None = None
        self.since_best = 0
        self.improved = False
        self.done = False
        self.hit_target = False

    def update(self, loss: float, accuracy: float, step: int) -> None:
        self.accuracy = accuracy
        if self.best_loss is None or loss < self.best_loss - self.sft.min_delta:
            self.best_loss, self.since_best = loss, 0
        else:
            self.since_best += 1
        self.improved = self.since_best == 0
        self.hit_target = accuracy >= self.sft.target_accuracy
        armed = step >= self.sft.min_steps and (self.accuracy_floor is None or accuracy >= self.accuracy_floor)
        plateau = self.sft.patience > 0 and self.since_best >= self.sft.patience and armed
        self.done = self.hit_target or plateau

    def reason(self) -> str:
        """``target`` | ``plateau`` | ``cap`` (the step cap, also without a validation split)."""
        if self.hit_target:
            return "target"
        return "plateau" if self.done else "cap"


class BestWeights:
    """This rank's parameter shards at the lowest validation loss so far, kept in host memory and put
    back at the end: the stage keeps the model validation chose, not the last step's (one more copy of
    the rank's shards in host memory)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.saved: list[torch.Tensor] | None = None
        self.step: int | None = None

    def save(self, step: int) -> None:
        self.saved, self.step = titan.copy_shards_to_host(self.model), step

    def restore(self) -> None:
        titan.restore_shards_(self.model, self.saved or [])


def train_sft(ctx: RunContext, out_dir: Path) -> dict:
    """Train from scratch (or from model.hf_assets_path) until the validation loss plateaus, validation
    accuracy reaches the target, or the step cap; keep the weights of the lowest validation loss."""
    cfg, sft = ctx.cfg, ctx.cfg.sft
    has_val = ctx.task.sft_validation is not None and len(ctx.task.sft_validation) > 0
    if not has_val and ctx.dist.is_rank0:
        print("[refexp] SFT: the task has no validation split (task.val_path / task.val_fraction), so no stop "
              f"rule applies: training to the sft.steps={sft.steps} cap")
    out_dir.mkdir(parents=True, exist_ok=True)
    model, optimizers, schedulers = _build_sft_model(ctx)
    log = MetricLogger(out_dir, enabled=ctx.dist.is_rank0)
    engine = build_engine(cfg.rollout, model, ctx.task.tokenizer,  # the configured engine, as every evaluation
                          capacity=decode_capacity(cfg))
    ceiling = _val_ceiling(ctx) if has_val else None
    stop = ValidationStop(sft, has_val=has_val, accuracy_floor=None if ceiling is None else ceiling - START_BAND)
    best = BestWeights(model)

    def validate() -> dict[str, float]:
        n, pd = cfg.eval.num_prompts, ctx.parallel_dims
        split = "sft_validation"  # every skill the stage teaches
        out = {"sft/val_loss": -logp_correct(model, ctx.task, n, parallel_dims=pd, split=split, per_token=True),
               "sft/val_accuracy": greedy_accuracy(model, ctx.task, n, parallel_dims=pd, split=split, engine=engine,
                                                   verifier=True)}
        stop.update(out["sft/val_loss"], out["sft/val_accuracy"], step)
        if stop.improved:
            best.save(step)
        return out

    step, t0 = 0, now(ctx.device)
    # each step's row is written once: the last one waits for the kept model's test accuracy
    pending: dict = validate() if stop.has_val else {}
    bar = progress_bar(total=sft.steps, desc="sft", enabled=ctx.dist.is_rank0 and cfg.logger.progress)
    while step < sft.steps and not stop.done:
        if pending:
            log.log(pending, step=step)
        step += 1
        loss, n_local, n_global, grad_norm = _sft_update(ctx, model, optimizers, schedulers, step)
        if step == 1:  # set-up is over (refexp/runtime/distributed.py, set_collective_timeout)
            rdist.set_collective_timeout(cfg.comm.train_timeout_seconds, ctx.parallel_dims)
        bar.update(1)
        # the global batch's token mean, not this rank's
        loss = rdist.dp_sum(ctx.parallel_dims, loss.detach() * n_local) / n_global.clamp(min=1)
        row = {"loss/total": float(loss), "sft/grad_norm": grad_norm}
        if stop.has_val and (step % sft.eval_every == 0 or step == sft.steps):
            row.update(validate())
            bar.set_postfix(loss=f"{float(loss):.3f}", val_acc=f"{row['sft/val_accuracy']:.2f}")
        pending = row
    if best.step is not None and best.step != step and not stop.hit_target:  # at the target: the model that hit it
        best.restore()
    # the model kept, measured once on the test split (reported, never used to stop or select)
    # the verifier, also when a learned reward is configured for the RL stage (its cache key holds no reward model)
    acc = greedy_accuracy(model, ctx.task, cfg.eval.num_prompts, parallel_dims=ctx.parallel_dims, engine=engine,
                          verifier=True)
    final = {EVAL_ACCURACY: acc}
    if ctx.task.retain_eval is not None:  # the skills RL will not train: what it starts from
        final[EVAL_RETENTION] = greedy_accuracy(model, ctx.task, cfg.eval.num_prompts, parallel_dims=ctx.parallel_dims,
                                                split="retain_eval", engine=engine, verifier=True)
    log.log({**pending, **final}, step=step)
    bar.close()
    summary = {"steps": step, "eval_accuracy": acc, "val_accuracy": stop.accuracy, "best_val_loss": stop.best_loss,
               "kept_step": step if best.step is None else best.step, "stopped_by": stop.reason(),
               "converged": converged(stop.reason(), has_val=has_val, patience=sft.patience),
               "wall_s": now(ctx.device) - t0}
    if EVAL_RETENTION in final:
        summary["eval_retention"] = final[EVAL_RETENTION]
    summary["val_ceiling"] = ceiling
    summary["warnings"] = start_warnings(summary, ceiling=summary["val_ceiling"], steps_cap=sft.steps)
    _save_sft_output(ctx, model, out_dir, summary)
    log.close()
    rdist.barrier()
    return summary


def _val_ceiling(ctx: RunContext) -> float | None:
    """The validation accuracy imitating the demonstrations allows, on the rows the stage validates on (the
    embedded arithmetic task; None for tasks without such a number)."""
    if ctx.cfg.task.name != "arithmetic":
        return None
    rows = ctx.task.sft_validation.select(range(min(ctx.cfg.eval.num_prompts, len(ctx.task.sft_validation))))
    return imitation_ceiling(rows["prompt"], ctx.cfg.task.digits, ctx.cfg.task.demo_slip)


def _build_sft_model(ctx: RunContext):
    """The model the stage trains (from ``model.hf_assets_path`` when set, else initialised with ``sft.seed``),
    its optimizer and its warmup-cosine schedule."""
    cfg, sft = ctx.cfg, ctx.cfg.sft
    model = build_run_model(ctx, trainable=True, seed=sft.seed)
    if cfg.model.hf_assets_path:
        titan.load_weights(model, cfg.model, cfg.model.hf_assets_path, hf=True)
    optimizers, schedulers = build_optimizer(model, optimizer=cfg.training.optimizer, lr=sft.lr,
                                             weight_decay=sft.weight_decay, warmup_steps=sft.warmup_steps,
                                             total_steps=sft.steps, decay_ratio=sft.decay_ratio, decay_type="cosine")
    return model, optimizers, schedulers


def _sft_update(ctx: RunContext, model, optimizers, schedulers, step: int):
    """One SFT update on this rank's rows of ``step``: the masked next-token loss, backward, clip, step.
    Returns (this rank's token-mean loss, its target tokens, the global batch's, the grad norm)."""
    rows = ctx.task.demonstrations.select(sft_batch(ctx, step))
    tokens, mask = pack_sequences(ctx.task.tokenizer, rows["prompt"], rows["completion"], add_eos=True)
    tokens, mask = tokens.to(ctx.device), mask.to(ctx.device)
    # mask[:, t] marks token t as a completion token; its log-prob sits at logp[:, t-1]. Only those
    # columns go through the output layer (``select_BT``): the loss reads no others.
    target = mask[:, 1:]
    logp = titan.token_logprobs(model, tokens, select_BT=target)
    loss, _ = sft_loss(logp, target)
    # FSDP sums gradients over ranks (docs/torchtitan-notes.md §5): weight the local mean by this
    # rank's share of the global target tokens so the update equals the single-process one.
    n_local = target.sum().to(torch.float32)
    n_global = rdist.dp_sum(ctx.parallel_dims, n_local)
    (loss * n_local / n_global).backward()
    grad_norm, _ = clip_and_step(model, optimizers, schedulers, max_norm=ctx.cfg.training.max_norm, loss=loss,
                                 step=step)
    return loss, n_local, n_global, grad_norm


def _save_sft_output(ctx: RunContext, model, out_dir: Path, summary: dict) -> None:
    """The kept model as a DCP checkpoint and an HF export, the tokenizer, and ``sft.json`` (last: it marks
    the output complete)."""
    cfg, tok = ctx.cfg, ctx.task.tokenizer
    # what follows (saving, exporting, building the RL stage's models) is set-up again
    rdist.set_collective_timeout(cfg.comm.init_timeout_seconds, ctx.parallel_dims)
    save_model_weights(model, out_dir / "model")
    if ctx.dist.is_rank0:
        tok.save(str(out_dir))
    titan.export_hf(model, cfg.model, str(out_dir / "hf"), tokenizer=tok)
    if ctx.dist.is_rank0:
        write_json_atomic(out_dir / "sft.json", summary)
