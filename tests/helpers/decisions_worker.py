"""Worker for tests/test_rank0_decisions.py: on 2 gloo ranks whose collectives time out after TIMEOUT_S,
rank 1 is shown another filesystem answer than rank 0 (monkeypatched), and every rank must follow rank 0's.

    PYTHONPATH=. python -m torch.distributed.run --standalone --nproc_per_node=2 tests/helpers/decisions_worker.py \
        OUT.json WORKDIR

Rank 0 writes {check: what every rank ended with, or a rank's error} to OUT.json. A rank that followed its own
answer would wait in a collective its peer never joins: the short timeout turns that hang into an error.
"""

import datetime
import json
import os
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

TIMEOUT_S = 10


def rank() -> int:
    return dist.get_rank()


def check_sft_cache_hit(workdir: Path):
    """Rank 0 finds the SFT model cached, rank 1 (stale attributes) does not, and their keys differ (the key holds
    the data files' times): both return rank 0's directory and neither trains."""
    import refexp.algos.sft as sft

    trained = []
    saved = (sft.sft_fingerprint, sft._sft_cached, sft.train_sft, sft.verified_entry)
    sft.sft_fingerprint = lambda ctx: f"key-{rank()}"
    sft._sft_cached = lambda out: rank() == 0
    sft.train_sft = lambda ctx, tmp: trained.append(str(tmp))
    sft.verified_entry = lambda out, what: "its digest"  # no entry on disk to verify
    try:
        ctx = SimpleNamespace(cfg=SimpleNamespace(sft=SimpleNamespace(enable=True, checkpoint=None), task=None),
                              task=SimpleNamespace(demonstrations=None),  # no rows: nothing to check for answers
                              cache_dir=workdir / "cache", dist=SimpleNamespace(is_rank0=rank() == 0))
        out = sft.ensure_sft(ctx)
    finally:
        sft.sft_fingerprint, sft._sft_cached, sft.train_sft, sft.verified_entry = saved
    return {"dir": out.name, "trained": len(trained)}


def check_weights_kind(workdir: Path):
    """Rank 1 sees an HF dir where rank 0 sees a DCP checkpoint, and another DCP folder: both load rank 0's."""
    import torch.distributed.checkpoint as dcp

    from refexp.titan import checkpoint_dirs as cd

    loaded = []
    saved = (cd.is_hf_dir, cd.load_hf_weights_, cd.dcp_dir, cd.check_dcp_dir, dcp.load)
    cd.is_hf_dir = lambda path: rank() == 1
    cd.load_hf_weights_ = lambda model, cfg, path: loaded.append(f"hf:{path}")
    cd.dcp_dir = lambda path: Path(path) / f"step-{rank()}"
    cd.check_dcp_dir = lambda path: None  # no checkpoint on disk to check
    dcp.load = lambda state, storage_reader: loaded.append(f"dcp:{Path(storage_reader.path).name}")
    try:
        cd.load_weights(torch.nn.Linear(2, 2), None, workdir)
    finally:
        cd.is_hf_dir, cd.load_hf_weights_, cd.dcp_dir, cd.check_dcp_dir, dcp.load = saved
    return loaded


def check_rank0_error(workdir: Path):
    """Rank 0's answer is an error: every rank raises it (none waits for a broadcast that never comes)."""
    from refexp.config import ConfigError
    from refexp.runtime.distributed import decided_by_rank0

    def decide():
        if rank() == 0:
            raise ConfigError("rank 0 found no checkpoint")
        return "rank 1's own answer"

    try:
        return decided_by_rank0(decide)
    except ConfigError as e:
        return f"ConfigError: {e}"


def check_export_waits(workdir: Path):
    """Rank 0 takes longer than the collective timeout to write the HF files: the other rank waits for it
    instead of failing, and the export is complete."""
    import safetensors.torch

    from refexp import titan
    from refexp.config import ParallelismConfig
    from tests.helpers.models import tiny_model_config

    par = ParallelismConfig(data_parallel_shard_degree=2)
    dims = titan.make_parallel_dims(par, 2, "cpu")
    cfg = tiny_model_config("llama3", vocab_size=15)
    model = titan.build_model(cfg, vocab_size=15, device="cpu", mesh=dims, parallelism=par, requires_grad=False)
    real = safetensors.torch.save_file

    def slow_save(*args, **kwargs):
        time.sleep(TIMEOUT_S + 5)
        return real(*args, **kwargs)

    safetensors.torch.save_file = slow_save
    try:
        titan.export_hf(model, cfg, str(workdir / "hf"))
    finally:
        safetensors.torch.save_file = real
    return sorted(p.name for p in (workdir / "hf").glob("*.safetensors"))


CHECKS = {"sft_cache_hit": check_sft_cache_hit, "weights_kind": check_weights_kind,
          "rank0_error": check_rank0_error, "export_waits": check_export_waits}


def main() -> None:
    out_path, workdir = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    results = {}
    for name, fn in CHECKS.items():
        try:
            mine = fn(workdir)
        except Exception:
            traceback.print_exc()
            mine = f"rank {rank()} failed: {traceback.format_exc(limit=3)}"
        every = [None, None]
        try:
            dist.all_gather_object(every, mine)
        except Exception:  # the group is broken (a timeout): record what this rank saw
            every = [mine, "?"]
            results[name] = every
            break
        results[name] = every
    if rank() == 0:
        Path(out_path).write_text(json.dumps(results, indent=1))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as titan_dist_worker: interpreter finalisation after gloo can abort a rank


if __name__ == "__main__":
    main()
