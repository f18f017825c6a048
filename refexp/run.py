"""``run(cfg)``: validate, build the parts in a spelled-out order, pick the algorithm, return final metrics.

Order (cheap checks first, so bad input fails before any model is built):
 1. config -> dataclasses (every ``__post_init__`` check), a generated task's data (``check_task_data``: its
    splits' sizes and reference answers, before ``model.pretrained`` is fetched and converted) and the
    model/parallelism check against the world size (torchtitan config only, no weights);
 2. spawn workers when the job asks for N processes but was started as one (``parallelism.nproc_per_node``);
 3. device, process group, threads;
 4. task (data + tokenizer + reward), logger (rank 0: W&B + metrics.jsonl), ``status.json``;
 5. the SFT model every algorithm starts from, then the algorithm's entry (``refexp/algos/entries.py``): ``sft``
    (just the stage) | ``rm`` (a reward model on the stage's samples) | ``grpo`` | ``dpo`` (which build policy,
    reference strategy, optimizer and checkpointer themselves).
``status.json`` in the run dir records running / completed / failed (with the error) so a sweep's
report lists failed runs instead of dropping them.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator

import torch
from omegaconf import DictConfig, OmegaConf

from refexp import titan
from refexp.algos.sft_checks import sft_start_record
from refexp.components.context import RunContext
from refexp.components.metric_logger import MetricLogger
from refexp.components.pretrained import resolve_pretrained
from refexp.components.rerun_checks import check_rerun_config, check_rerun_steps, resolved_container
from refexp.components.run_identity import START, run_identity, start_pins
from refexp.config import ConfigError, RootConfig, to_object
from refexp.config.root import generation_budget
from refexp.record import layout
from refexp.record.hydra_record import HydraRecord
from refexp.record.lock import FileLock, LockHeld
from refexp.record.metric_names import (
    EVAL_ACCURACY,
    EVAL_PASS_AT_K,
    EVAL_PREF_ACCURACY,
    EVAL_RETENTION,
    KL_INIT,
    KL_REF,
    VAL_ACCURACY,
)
from refexp.record.provenance import provenance
from refexp.record.rerun import RerunRecord, completed_end, pending_hydra_dir
from refexp.record.resolved_config import write_resolved_config
from refexp.record.status import (
    Heartbeat,
    RunStatus,
    close_run_status,
    open_status,
    read_status,
    record_early_failure,
    record_launch_failure,
    run_dir_busy,
)
from refexp.runtime import distributed as rdist
from refexp.runtime import stop_signals
from refexp.runtime.job_placement import use_own_core, use_own_gpu
from refexp.runtime.process_settings import apply_process_settings
from refexp.tasks.data_checks import check_task_data


def run_from_hydra(cfg: DictConfig) -> float | None:
    """Entry from ``@hydra.main``: fill ``run_dir`` from Hydra's output dir, run, return what a sweeper maximises."""
    from hydra.core.hydra_config import HydraConfig

    hydra_record = HydraRecord(cfg)  # as Hydra passed the config, before run_dir is filled in
    if cfg.get("run_dir") is None:
        OmegaConf.set_struct(cfg, False)
        cfg.run_dir = HydraConfig.get().runtime.output_dir
        OmegaConf.set_struct(cfg, True)
    if HydraConfig.get().mode.name != "MULTIRUN":
        started = time.monotonic()
        final = run(cfg, on_checked=hydra_record.write)
        if rdist.is_rank0() and isinstance(final, dict):
            print(summary_line(final, time.monotonic() - started, cfg.run_dir))
        return search_value(final)
    # In a sweep, one failing job must not stop the others (Hydra would re-raise the first failure
    # after the batch and skip the report): the failure is in the job's status.json and log, the
    # report lists it, and refexp.cli.sweep.ReportCallback makes the sweep exit non-zero at the end.
    try:
        use_own_gpu(cfg)
        use_own_core(cfg)
        final = run(cfg, on_checked=hydra_record.write)
    except Exception as e:
        import logging

        logging.getLogger("refexp").exception("job %s failed; the sweep goes on", cfg.run_dir)
        if rdist.is_rank0() and not isinstance(e, RunDirBusy):  # a busy run dir is another process's to write
            record_early_failure(cfg.run_dir, e)  # a job failed before run_worker: a config error
            hydra_record.write_if_absent()  # its arm, for the report
        if rdist.is_rank0():  # also a refused rerun, whose run dir keeps its completed status: the exit says so
            from refexp.record.failed_jobs import record_failed_job

            record_failed_job(HydraConfig.get().sweep.dir, cfg.run_dir, e)
        print(f"[refexp] job failed: {cfg.run_dir} (see its status.json)", file=sys.stderr)
        return None
    return search_value(final)


def search_value(final) -> float | None:
    """What a sweeper (Optuna's, conf/hparams_search/) maximises: the final validation accuracy
    (``val/accuracy``), else None, never the held-out ``eval/accuracy``: a search must not select on test.
    Optuna records a None as a failed trial; a search without a validation split is refused before its
    first trial (``refexp.config.check_search_validation``)."""
    if not isinstance(final, dict):
        return None
    return final.get(VAL_ACCURACY)


def summary_line(final: dict, wall_s: float, run_dir) -> str:
    """One line at the end of a single run: what it reached, how far it drifted, how long it took, where it is."""
    parts = [f"{k} {final[k]:.3f}" for k in (EVAL_ACCURACY, EVAL_PREF_ACCURACY, VAL_ACCURACY, EVAL_RETENTION,
                                             EVAL_PASS_AT_K, KL_INIT, KL_REF)
             if isinstance(final.get(k), (int, float))]
    steps = final.get("step")
    parts.append(f"{int(steps)} steps" if isinstance(steps, (int, float)) else "")
    return f"[refexp] done: {', '.join(p for p in parts if p)} in {wall_s / 60:.1f} min; run dir {run_dir}"


def validate(dcfg: DictConfig, cfg: RootConfig | None = None) -> RootConfig:
    """Every check that needs no weights: the config layer's (``to_object``), then those it cannot make.

    Those stay here because the config layer sits below them: the degrees against the launched world size
    and the model's shapes against the parallelism need torchtitan (``ParallelDims``, the flavor's model
    args or the checkpoint's ``config.json``); the task's sources need the datasets Hub and the reward hook's
    import; ``rm.policies`` need their dirs read; the rerun check needs the run dir's saved config. ``cfg``:
    ``to_object(dcfg)`` when already made."""
    cfg = cfg or to_object(dcfg)
    if cfg.run_dir is None:
        raise ConfigError("run_dir is not set (run through `refexp`, or pass run_dir=DIR)")
    world = rdist.launched_world_size()
    world = world if world > 1 else cfg.parallelism.nproc_per_node
    if world > 1:
        titan.make_parallel_dims(cfg.parallelism, world, "cpu")  # degrees vs world size; no mesh yet
    # The tokenizer is not loaded yet: an HF checkpoint's config.json states its own vocabulary, and the
    # embedded task's is small; 64 stands in for it only to check the shapes against the parallelism.
    vocab = cfg.model.vocab_size or (None if cfg.model.hf_assets_path else 64)
    spec = titan.build_model_spec(cfg.model, vocab_size=vocab, parallelism=cfg.parallelism)
    if cfg.model.lora.enabled:  # every target names a layer, and the rank fits each one
        titan.lora_targets(spec.model, cfg.model.lora)
    from refexp.tasks.sources import check_sources

    check_sources(cfg.task)  # local paths, Hub ids (reachable?), the task.reward hook
    if cfg.rm.policies:  # the reward-model stage's policies: each an HF export of this model, before any samples
        from refexp.algos.rm_sources import check_policy_shapes
        from refexp.titan.spec import model_arch

        vocab_known = bool(cfg.model.vocab_size or cfg.model.hf_assets_path)
        check_policy_shapes(cfg.rm, model_arch(cfg.model, vocab if vocab_known else None), cfg.model.name, vocab_known)
    check_rerun_config(dcfg, Path(cfg.run_dir))
    check_rerun_steps(cfg, Path(cfg.run_dir))
    return cfg


class RunDirBusy(ConfigError):
    """The run dir is being written by another process (its lock is held)."""


def run(dcfg: DictConfig, on_checked: Callable[[], None] | None = None) -> dict:
    """Validate, then train (spawning ``parallelism.nproc_per_node`` workers when started as one process).
    ``dry_run=true`` never reaches here: ``refexp/__main__.py`` plans it (refexp/cli/dry_run.py).

    The config layer's checks come first (a bad value leaves no run dir); then the run dir's lock (one writer at
    a time) is taken, by this process when it launches the job
    (before spawning workers) or is rank 0 of a torchrun/SLURM job, and held until the job ends; stop
    signals raise from then on (``refexp/runtime/stop_signals.py``), so every phase ends with a true status.
    ``on_checked()``: called once the run dir is locked and the checks that read it passed (Hydra's ``.hydra/``
    record is written there: ``refexp/record/hydra_record.py``)."""
    with stop_signals.installed():
        cfg = to_object(dcfg)  # the config layer's checks first: a bad value makes no run dir
        check_task_data(cfg)  # generated splits' sizes and reference answers, before a model is fetched
        if resolve_pretrained(dcfg):  # model.pretrained fetched and converted (once) into model.hf_assets_path
            cfg = to_object(dcfg)
        with _run_dir_lock(dcfg.get("run_dir")):
            return _validated_run(dcfg, cfg, on_checked)


def _validated_run(dcfg: DictConfig, cfg: RootConfig, on_checked: Callable[[], None] | None = None) -> dict:
    """``run`` once the run dir is locked: the checks that read it, then the workers or this process's run."""
    cfg = validate(dcfg, cfg)
    if on_checked is not None and _holds_the_lock():
        on_checked()
    if cfg.parallelism.nproc_per_node > 1 and rdist.launched_world_size() == 1:
        from refexp.runtime.launcher import spawn_workers

        return spawn_workers(_spawned_worker, dcfg, cfg.parallelism.nproc_per_node,
                             on_failure=lambda error: record_launch_failure(cfg.run_dir, error))
    return run_worker(dcfg, cfg)


def _holds_the_lock() -> bool:
    """Whether this process takes the run dir's lock: the one that launches the job, or rank 0 of a torchrun/SLURM
    job (before the process group exists, where ``rdist.is_rank0`` is true on every rank)."""
    return rdist.launched_world_size() == 1 or os.environ.get("RANK", "0") == "0"


@contextmanager
def _run_dir_lock(run_dir: str | None) -> Iterator[None]:
    """The run dir made and locked by the launching process or rank 0 (other ranks: nothing to do)."""
    if run_dir is None or not _holds_the_lock():
        yield
        return
    try:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create run_dir={run_dir!r}: {e.strerror or e}") from None
    try:
        lock = FileLock(layout.path(run_dir, layout.LOCK)).acquire()
    except LockHeld as e:
        raise RunDirBusy(run_dir_busy(run_dir, e.owner)) from None
    try:
        shutil.rmtree(pending_hydra_dir(run_dir), ignore_errors=True)  # a killed rerun's; on_checked writes its own
        yield
    finally:
        lock.release()


def _spawned_worker(dcfg: DictConfig) -> dict:
    """``run_worker`` in a process started by ``refexp.runtime.launcher`` (a fresh interpreter: Hydra's
    ConfigStore is empty there)."""
    from refexp.config import register_configs

    register_configs()
    with stop_signals.installed():
        return run_worker(dcfg)


def run_worker(dcfg: DictConfig, cfg: RootConfig | None = None) -> dict:
    """One process of a run (rank r of N, or the only one)."""
    cfg = cfg or validate(dcfg)
    apply_process_settings(cfg.training)  # before the device is touched (CUBLAS_WORKSPACE_CONFIG)
    device = titan.resolve_device(cfg.training.device)
    titan.prepare_torchtitan(device.type)
    info = rdist.init_distributed(device, backend=cfg.comm.backend, timeout_s=cfg.comm.init_timeout_seconds)
    run_dir = _agree_on_run_dir(cfg, info)
    parallel_dims = (titan.make_parallel_dims(cfg.parallelism, info.world_size, device.type)
                     if info.world_size > 1 else None)

    import datasets

    from refexp.components.tokenizer_start import check_tokenizer_against_start
    from refexp.tasks import build_task

    datasets.disable_progress_bars()  # one tqdm line per saved split drowns the run's own output
    cache_dir = Path(os.path.expanduser(cfg.sft.cache_dir))
    lengths = dict(max_seq_len=cfg.model.max_seq_len, new_tokens=generation_budget(cfg))
    task = build_task(cfg.task, str(cache_dir), algo=cfg.algo.name, **lengths) if info.is_rank0 else None
    rdist.barrier()
    # other ranks read rank 0's cache
    task = task or build_task(cfg.task, str(cache_dir), algo=cfg.algo.name, **lengths)
    check_tokenizer_against_start(task.tokenizer, cfg.task.tokenizer_path, sft_checkpoint=cfg.sft.checkpoint,
                                  hf_assets_path=cfg.model.hf_assets_path, model_vocab_size=cfg.model.vocab_size,
                                  warn=info.is_rank0)  # every rank: each raises the same error, none waits

    resolved = resolved_container(dcfg)
    status = RunStatus(algo=cfg.algo.name, reference=cfg.reference.name, seed=cfg.training.seed,
                       steps=cfg.training.steps, provenance=provenance(), cpus=cpu_record())
    earlier = (read_status(run_dir) or {}) if info.is_rank0 else {}  # a resumed run's earlier invocations
    # A completed run's record is written only once this rerun passes its end (refexp/record/rerun.py)
    completed_at = rdist.broadcast_object(completed_end(earlier))
    record = RerunRecord(run_dir, completed_at, enabled=info.is_rank0, on_promote=lambda: open_status(run_dir, status))
    if info.is_rank0:
        write_resolved_config(record.dir, resolved)
    logger = MetricLogger(run_dir, enabled=info.is_rank0, wandb_cfg=cfg.logger, resolved_config=resolved,
                          run_info=wandb_run_info(cfg), record=record)
    ctx = RunContext(cfg=cfg, run_dir=run_dir, cache_dir=cache_dir, device=device, dist=info,
                     parallel_dims=parallel_dims, task=task, logger=logger, completed_at=completed_at,
                     identity=run_identity(resolved, run_dir))
    if info.is_rank0:
        open_status(record.dir, status)
    rdist.barrier()  # "running" is on disk before any rank can record a failure over it (refexp/record/status.py)
    heartbeat = Heartbeat(run_dir).start() if info.is_rank0 else None  # every phase, not only logged steps
    try:
        final = _dispatch(ctx, status)
        status.status, status.final, status.last_step = "completed", final, int(final.get("step", cfg.training.steps))
        logger.summary(final)
        return final
    except BaseException as e:
        rdist.note_run_failed()
        status.stopped(e, preempted=isinstance(e, stop_signals.Preempted), last_step=logger.last_step,
                       traceback=traceback.format_exc(limit=20), where=run_dir)
        raise
    finally:
        if heartbeat is not None:
            heartbeat.stop()
        try:
            if info.is_rank0 and record.protected:  # it never passed the completed run's end
                record.discard()
                print(f"[refexp] {run_dir} holds a run completed at step {completed_at}; this rerun "
                      f"{'ended' if status.status == 'completed' else 'stopped'} without passing it, so that "
                      f"run's record is unchanged", file=sys.stderr)
            else:  # a rank > 0 records its failure beside rank 0's status: the copy's while there is one
                close_run_status(run_dir if info.is_rank0 or not record.scratch.is_dir() else record.scratch,
                                 status, earlier, info.rank)
        except OSError as e:
            if status.status == "completed":
                raise
            # the run's own error is on its way out: a failed status write must not replace it
            print(f"[refexp] could not write {run_dir / layout.STATUS}: {type(e).__name__}: {e}", file=sys.stderr)
        finally:
            logger.close(0 if status.status == "completed" else 1)


def _agree_on_run_dir(cfg: RootConfig, info) -> Path:
    """Rank 0's run dir on every rank.

    Under torchrun each rank composes its own config, and Hydra's default output dir has a
    timestamp that can differ between ranks by a second. The other ranks take rank 0's and remove
    the dir Hydra made for them when it holds nothing but Hydra's own files (``.hydra/``, a log).
    """
    run_dir = Path(cfg.run_dir)
    if info.world_size == 1:
        return run_dir
    agreed = Path(rdist.broadcast_object(str(run_dir.resolve())))
    if agreed != run_dir.resolve():
        if run_dir.is_dir() and all(p.name == ".hydra" or p.suffix == ".log" for p in run_dir.iterdir()):
            import shutil

            shutil.rmtree(run_dir, ignore_errors=True)
        cfg.run_dir = str(agreed)
    return agreed


def _dispatch(ctx: RunContext, status: RunStatus) -> dict:
    """The SFT model every algorithm starts from (made or found), then the algorithm's entry
    (``refexp/algos/entries.py``)."""
    from refexp.algos.entries import ALGORITHMS
    from refexp.algos.sft import ensure_sft, read_sft_summary

    algo = ctx.cfg.algo.name
    if algo not in ALGORITHMS:
        raise ConfigError(f"algo={algo!r} is invalid: expected {', '.join(ALGORITHMS)}")
    sft_dir = ensure_sft(ctx)
    summary = rdist.decided_by_rank0(lambda: read_sft_summary(sft_dir))
    pins = start_pins(ctx.cfg, sft_dir) if ctx.dist.is_rank0 else {}  # rank 0 writes and checks checkpoints
    ctx = replace(ctx, identity={**ctx.identity, "pins": pins})
    status.sft_start = sft_start_record(sft_dir, summary, sha256=pins.get(START, {}).get("sha256"))
    if ctx.dist.is_rank0:  # every run from a start that is not what a comparison assumes says so (algos/sft_checks.py)
        for warning in summary.get("warnings") or []:
            print(f"[refexp] warning: {warning} ({sft_dir.name})", flush=True)
    return ALGORITHMS[algo](ctx, sft_dir, summary)


def cpu_record() -> dict:
    """What ``status.json`` says of this process's CPU use (``RunStatus.cpus``): torch's intra-op threads and the
    cores it may run on."""
    return {"threads": torch.get_num_threads(), "affinity": sorted(os.sched_getaffinity(0))}


def wandb_run_info(cfg: RootConfig) -> dict:
    """W&B group / job_type / name / tags / sweep id (``refexp/components/wandb_conventions.py``)."""
    from refexp.components.wandb_conventions import hydra_run_info

    return hydra_run_info(cfg)
