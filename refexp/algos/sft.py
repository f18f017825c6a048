"""The SFT stage: the model every RL run starts from and that ``reference=fixed`` keeps.

Masked next-token loss on the task's demonstrations (prompt tokens masked out), held-out greedy
exact match every ``sft.eval_every`` steps, and an early stop at ``sft.target_accuracy`` with a
step cap: on the embedded task accuracy sits near zero and then jumps within a few hundred steps at
a seed-dependent point, so a fixed step count would give very different SFT models per seed.

The output is cached under ``<cache>/sft/<hash of everything that determines it>/``: ``model/``
(a model-only DCP checkpoint, loads into any parallelism), ``hf/`` (HF safetensors export),
``tokenizer.json``, ``metrics.jsonl`` and ``sft.json`` (written last: its presence marks a complete
result). A file lock makes concurrent jobs of a sweep train it once; the result is written to a
temporary directory and renamed into place (``refexp.io.atomic_dir``). A failed stage removes its
temporary; one killed outright cannot, and the next job to take the lock removes it.
"""

from __future__ import annotations

import fcntl
from contextlib import contextmanager, nullcontext
from dataclasses import asdict
from pathlib import Path

import torch

from refexp import distributed as rdist
from refexp import titan
from refexp.titan import save_model_weights
from refexp.context import RunContext
from refexp.evaluation import greedy_accuracy
from refexp.data_order import batch_ids
from refexp.hashing import stable_hash
from refexp.io import atomic_dir, remove_temporaries, write_json_atomic
from refexp.logging import MetricLogger
from refexp.losses import sft_loss
from refexp.models import build_model
from refexp.optim import build_optimizer, clip_and_step
from refexp.progress import progress_bar
from refexp.rollout import build_engine
from refexp.timing import now
from refexp.tasks import task_fingerprint
from refexp.tasks.batching import pack_sequences


def sft_fingerprint(ctx: RunContext) -> str:
    """Hash of what determines the SFT model: model shape, task data, the sft block, dtypes."""
    cfg = ctx.cfg
    # enable is always true here; leaving it out keeps the keys of caches made before it existed.
    sft = {k: v for k, v in asdict(cfg.sft).items() if k not in ("cache_dir", "checkpoint", "enable")}
    key = {"model": asdict(cfg.model), "task": task_fingerprint(cfg.task), "sft": sft, "dtype": cfg.training.dtype,
           "vocab": ctx.task.tokenizer.vocab_size, "version": 1}
    compute = cfg.training.compute_dtype(ctx.device.type)
    if compute != "float32":  # bf16 compute trains another model; float32 keys stay those of older caches
        key["compute_dtype"] = compute
    return stable_hash(key, 16)


@contextmanager
def _file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_sft(ctx: RunContext) -> Path:
    """The dir the RL stage starts from: ``model.hf_assets_path`` when ``sft.enable=false`` (a pretrained
    HF checkpoint; ``titan.load_weights`` recognises it), ``sft.checkpoint`` if given, else the SFT
    output, cached or trained now."""
    if not ctx.cfg.sft.enable:  # RootConfig's checks guarantee hf_assets_path is set
        return Path(ctx.cfg.model.hf_assets_path)
    if ctx.cfg.sft.checkpoint:
        p = Path(ctx.cfg.sft.checkpoint)
        if not p.is_dir():
            from refexp.config import ConfigError

            raise ConfigError(f"sft.checkpoint={str(p)!r} is not a directory (expected a refexp SFT output dir)")
        return p
    out = ctx.cache_dir / "sft" / sft_fingerprint(ctx)
    if _complete(out):
        return out
    # Rank 0 takes the cross-process lock; all ranks then agree on whether training is needed.
    lock = _file_lock(ctx.cache_dir / "sft" / f"{out.name}.lock") if ctx.dist.is_rank0 else nullcontext()
    with lock:
        if ctx.dist.is_rank0:
            remove_temporaries(out)  # left by a run killed while training this model; the lock excludes live ones
        if rdist.broadcast_object(not _complete(out)):
            # rank 0 makes the temp dir and renames it into place; every rank trains into it
            with (atomic_dir(out, is_complete=_complete) if ctx.dist.is_rank0 else nullcontext()) as tmp:
                tmp = Path(rdist.broadcast_object(str(tmp) if tmp is not None else None))
                train_sft(ctx, tmp)
            rdist.barrier()
    return out


def _complete(out: Path) -> bool:
    return (out / "sft.json").is_file()  # written last


def sft_batch(ctx: RunContext, step: int) -> list[int]:
    """This rank's rows of the global SFT batch of ``step`` (``refexp.data_order``, keyed by ``sft.seed``)."""
    b = ctx.cfg.sft.batch_size
    return batch_ids(len(ctx.task.train), b, ctx.cfg.sft.seed, step)[rdist.local_slice(ctx.parallel_dims, b)]


def train_sft(ctx: RunContext, out_dir: Path) -> dict:
    """Train from scratch (or from model.hf_assets_path) until the target accuracy or the step cap."""
    cfg, sft = ctx.cfg, ctx.cfg.sft
    out_dir.mkdir(parents=True, exist_ok=True)
    model = build_model(ctx, trainable=True, seed=sft.seed)
    if cfg.model.hf_assets_path:
        titan.load_weights(model, cfg.model, cfg.model.hf_assets_path, hf=True)
    optimizers, schedulers = build_optimizer(model, optimizer=cfg.training.optimizer, lr=sft.lr,
                                             weight_decay=sft.weight_decay, warmup_steps=sft.warmup_steps,
                                             total_steps=sft.steps)
    log = MetricLogger(out_dir, enabled=ctx.dist.is_rank0)
    tok = ctx.task.tokenizer
    train = ctx.task.train
    engine = build_engine(cfg.rollout, model, ctx.task.tokenizer)  # the configured engine, as every evaluation
    acc = greedy_accuracy(model, ctx.task, cfg.eval.num_prompts, parallel_dims=ctx.parallel_dims, engine=engine)
    step, t0 = 0, now(ctx.device)
    log.log({"eval/accuracy": acc}, step=0)
    bar = progress_bar(total=sft.steps, desc="sft", enabled=ctx.dist.is_rank0 and cfg.logger.progress)
    while step < sft.steps and acc < sft.target_accuracy:
        step += 1
        rows = train.select(sft_batch(ctx, step))
        tokens, mask = pack_sequences(tok, rows["prompt"], rows["completion"], add_eos=True)
        tokens, mask = tokens.to(ctx.device), mask.to(ctx.device)
        logp = titan.token_logprobs(model, tokens)
        # mask[:, t] marks token t as a completion token; its log-prob sits at logp[:, t-1].
        target = mask[:, 1:]
        loss, metrics = sft_loss(logp, target)
        # FSDP sums gradients over ranks (docs/torchtitan-notes.md §5): weight the local mean by this
        # rank's share of the global target tokens so the update equals the single-process one.
        n_local = target.sum().to(torch.float32)
        n_global = rdist.dp_sum(ctx.parallel_dims, n_local)
        (loss * n_local / n_global).backward()
        grad_norm, _ = clip_and_step(model, optimizers, schedulers, max_norm=cfg.training.max_norm, loss=loss,
                                     step=step)
        if step == 1:  # set-up is over (refexp/distributed.py, set_collective_timeout)
            rdist.set_collective_timeout(cfg.comm.train_timeout_seconds, ctx.parallel_dims)
        bar.update(1)
        # the global batch's token mean, not this rank's
        loss = rdist.dp_sum(ctx.parallel_dims, loss.detach() * n_local) / n_global.clamp(min=1)
        row = {"loss/total": float(loss), "sft/grad_norm": grad_norm}
        if step % sft.eval_every == 0 or step == sft.steps:
            acc = greedy_accuracy(model, ctx.task, cfg.eval.num_prompts, parallel_dims=ctx.parallel_dims,
                                  engine=engine)
            row["eval/accuracy"] = acc
            bar.set_postfix(loss=f"{float(loss):.3f}", acc=f"{acc:.2f}")
        log.log(row, step=step)
    bar.close()
    wall = now(ctx.device) - t0
    # what follows (saving, exporting, building the RL stage's models) is set-up again
    rdist.set_collective_timeout(cfg.comm.init_timeout_seconds, ctx.parallel_dims)
    save_model_weights(model, out_dir / "model")
    if ctx.dist.is_rank0:
        tok.save(str(out_dir))
    titan.export_hf(model, cfg.model, str(out_dir / "hf"), tokenizer=tok)
    summary = {"steps": step, "eval_accuracy": acc, "wall_s": wall, "reached_target": acc >= sft.target_accuracy}
    if ctx.dist.is_rank0:
        write_json_atomic(out_dir / "sft.json", summary)
    log.close()
    rdist.barrier()
    return summary
