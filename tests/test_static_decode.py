"""rollout.static_decode in a run: the fixed-shape step compiles once per bucket (rows padded to a power of two,
the run's fixed cache capacity), not once per batch; and a first compile on one rank that outlasts the
collective timeout does not kill the others (refexp/runtime/distributed.py, setup_timeout)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from refexp import titan
from refexp.components import sampler
from refexp.run import run
from refexp.titan import static_decode
from tests.helpers.compile_count import CountingBackend
from tests.helpers.configs import TINY_GRPO_OVERRIDES, compose_tiny_run

pytestmark = pytest.mark.numerics  # tests/README.md: run under other CPU kernels too


@pytest.mark.slow
def test_a_grpo_run_with_evaluations_compiles_the_decode_step_once_per_bucket(tmp_path, monkeypatch):
    """5 GRPO steps (16 rows each) with evaluations at steps 0, 2, 4, 5 (16 greedy rows on test and on
    validation, 8 sampled rows for kl/init), on batches whose longest prompts differ: every generation decodes
    with the fixed-shape step, and the counting backend sees one graph per bucket of rows, whatever the batch."""
    # the SFT stage cached first, on the task the recorded run trains (task.ops is in the SFT's cache key): alone, the
    # test must not count the SFT's own validation generations
    run(compose_tiny_run(tmp_path / "warm", *TINY_GRPO_OVERRIDES, "task.ops=[+]", "training.steps=0"))
    backend = CountingBackend()
    titan.release_static_buckets()
    monkeypatch.setattr(static_decode, "CPU_BACKEND", backend)
    rows_seen, prompt_lens, generate = [], set(), sampler.generate

    def recording(model, tokenizer, prompts, **kw):
        """Records the rows, and cuts the first 0-2 characters off every prompt (the embedded task's are all
        alike long; real data's batches differ in their longest prompt)."""
        assert kw["static_decode"] and kw["static_capacity"] == 64 + 6  # task.max_prompt_len + task.max_new_tokens
        cut = len(rows_seen) % 3
        rows_seen.append(len(prompts))
        prompts = [p[cut:] for p in prompts]
        prompt_lens.add(max(len(tokenizer.encode(p, add_bos=True)) for p in prompts))
        return generate(model, tokenizer, prompts, **kw)

    monkeypatch.setattr(sampler, "generate", recording)
    try:
        run(compose_tiny_run(tmp_path / "grpo", *TINY_GRPO_OVERRIDES, "training.steps=5", "eval.every=2",
                             "eval.log_samples=0", "rollout.static_decode=true",
                                 "task.ops=[+]", "eval.pass_k=0"))  # accuracy's evaluations only: the counts below
    finally:
        titan.release_static_buckets()
    assert rows_seen.count(16) == 5 + 2 * 4 and rows_seen.count(8) == 4  # GRPO; eval + val; kl/init
    assert len(prompt_lens) == 3  # the capacity did not follow them
    buckets = {static_decode.bucket_rows(n) for n in rows_seen}
    assert buckets == {8, 16}
    assert backend.graphs == len(buckets)


WORKER = textwrap.dedent("""
    import os, sys, time, torch, torch.distributed as dist
    from refexp.runtime import distributed as d
    info = d.init_distributed(torch.device("cpu"), timeout_s=60)
    d.set_collective_timeout(2)  # training's timeout: 2 s
    guarded = sys.argv[1] == "guarded"
    ctx = d.setup_timeout() if guarded else __import__("contextlib").nullcontext()
    with ctx:
        if info.rank == 1:
            time.sleep(5)  # a first compile that outlasts the training timeout on one rank only
    t = torch.tensor([info.rank + 1.0])
    dist.all_reduce(t)  # the next collective: the decode loop's stop check
    print("sum", t.item(), flush=True)
    dist.destroy_process_group()
    os._exit(0)
""")


@pytest.mark.slow
@pytest.mark.parametrize("guarded", [True, False])
def test_a_slow_first_compile_on_one_rank_does_not_time_out_the_other(guarded):
    """Two gloo ranks under a 2 s collective timeout; rank 1 works 5 s before the next collective. Inside
    ``setup_timeout`` (the set-up timeout, 60 s, then a barrier) both finish; without it rank 0's
    collective times out: the test sees the failure it guards against."""
    from tests.helpers.processes import free_slurm_job_id

    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                              "MASTER_PORT")}
    job = free_slurm_job_id()
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, "guarded" if guarded else "bare"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=dict(base, SLURM_PROCID=str(r), SLURM_NTASKS="2", SLURM_LOCALID=str(r),
                                       SLURM_JOB_ID=job, SLURM_JOB_NODELIST="localhost", OMP_NUM_THREADS="1"))
             for r in (0, 1)]
    outs = [p.communicate(timeout=120) for p in procs]
    if guarded:
        assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
        assert [o[0].split() for o in outs] == [["sum", "3.0"]] * 2
    else:
        assert procs[0].returncode != 0 and "timed out" in outs[0][1].lower(), outs[0][1][-2000:]
