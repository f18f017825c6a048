"""Worker for tests/test_titan_distributed.py: 2-rank (gloo) checks of refexp.titan against a
single-process model built in the same process. Run with the repository root on PYTHONPATH:

    PYTHONPATH=. python -m torch.distributed.run --standalone --nproc_per_node=2 tests/helpers/titan_dist_worker.py \
        OUT.json WORKDIR [CHECKS]

(4 processes: FSDP x TP 2 x 2; CHECKS: a comma-separated subset.)

Every rank builds the single-process reference itself (same seed => same weights), so nothing but
the final numbers crosses processes. Rank 0 writes {check: max abs error} to OUT.json; a check that
raises is recorded as its error message instead.
"""

import contextlib
import dataclasses
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from refexp import titan
from refexp.config import ParallelismConfig
from refexp.titan.unwrap import canonical_name
from tests.helpers.grouped_rows import grouped_ragged_rows
from tests.helpers.models import tiny_model_config

V = 15  # odd: uneven vocab shards under TP and FSDP


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def sharded_params(model) -> dict[str, torch.Tensor]:
    """Full values of the parameters FSDP keeps (its shards), whatever it currently has registered."""
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()
    return {n: full(p) for n, p in model.named_parameters()}


def batch(B: int = 4, T: int = 12) -> torch.Tensor:
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(1))


def build(cfg, par=None, dims=None, seed=0, requires_grad=True):
    return titan.build_model(cfg, vocab_size=V, device="cpu", seed=seed, mesh=dims, parallelism=par,
                             requires_grad=requires_grad)


@contextlib.contextmanager
def _counting_selected(calls: list):
    """Record each call of ``titan.logprobs._selected_logprobs`` (the output layer at selected positions only)."""
    from refexp.titan import logprobs as titan_logprobs

    inner = titan_logprobs._selected_logprobs

    def counted(*args, **kwargs):
        calls.append(1)
        return inner(*args, **kwargs)

    titan_logprobs._selected_logprobs = counted
    try:
        yield
    finally:
        titan_logprobs._selected_logprobs = inner


def check_logprobs_and_grads(cfg, par, dims, selected: bool = False) -> float:
    """Same log-probs, entropies and gradients as one process. Data-parallel ranks each take half
    the batch and normalise by the global token count (docs/torchtitan-notes.md §5); TP ranks all take the whole batch.
    ``selected``: the distributed model computes only at a selection of positions (``select_BT``: the output
    layer at those positions under FSDP, the vocab-parallel full path under TP), compared with one process's
    full log-probs zeroed off the selection."""
    ref, model = build(cfg), build(cfg, par, dims)
    # Tied embeddings (qwen3) stay one parameter through TP and FSDP.
    assert len(list(model.parameters())) == len(list(ref.parameters())), "parameter count changed"
    tokens = batch()
    select = torch.arange(tokens.shape[1] - 1)[None, :] >= torch.arange(tokens.shape[0])[:, None] * 2
    lp_ref, ent_ref = titan.token_logprobs(ref, tokens, temperature=0.7, with_entropy=True)
    if selected:
        lp_ref, ent_ref = torch.where(select, lp_ref, 0.0), torch.where(select, ent_ref, 0.0)
    (-lp_ref.sum() / lp_ref.numel()).backward()
    if par.tensor_parallel_degree > 1:
        rows = slice(None)
    else:
        half = tokens.shape[0] // dims.world_size
        rows = slice(dist.get_rank() * half, (dist.get_rank() + 1) * half)
    calls = []
    with _counting_selected(calls):
        lp, ent = titan.token_logprobs(model, tokens[rows], temperature=0.7, with_entropy=True,
                                       select_BT=select[rows] if selected else None)
    # the output layer at the selection itself under FSDP; TP falls back to the vocab-parallel full logits
    assert len(calls) == (1 if selected and par.tensor_parallel_degree == 1 else 0), calls
    (-lp.sum() / lp_ref.numel()).backward()
    err = max((lp - lp_ref[rows]).abs().max().item(), (ent - ent_ref[rows]).abs().max().item())
    ref_grads = {canonical_name(n): p.grad for n, p in ref.named_parameters()}
    for n, p in model.named_parameters():
        err = max(err, (full(p.grad) - ref_grads[canonical_name(n)]).abs().max().item())
    return err


def check_shared_rows(cfg, par, dims, selected: bool = False) -> float:
    """Prompt sharing through ``titan.CausalRows`` (gathered usual rows, causal attention): the same log-probs
    and gradients as one process's usual layout. Data-parallel ranks each take one of the two groups.
    ``selected``: the output layer only at the completion columns (``row_logprobs(select=True)``)."""
    from functools import partial

    from refexp.algos.shared_prompt import row_logprobs, share_groups

    ref, model = build(cfg), build(cfg, par, dims)
    G, p, c = 4, 3, 6
    tokens, mask = grouped_ragged_rows(2, G, p, c, V)  # ragged completions, shared prompts
    lp_ref = torch.where(mask, titan.token_logprobs(ref, tokens), 0.0)
    (-lp_ref.sum() / mask.sum()).backward()
    rows = slice(None) if par.tensor_parallel_degree > 1 else slice(dist.get_rank() * G, (dist.get_rank() + 1) * G)
    shared = share_groups(tokens[rows], mask[rows], G, pad_id=0, attention="rows")
    lp = row_logprobs(partial(titan.token_logprobs, model), tokens[rows], mask[rows], shared, select=selected)
    (-lp.sum() / mask.sum()).backward()
    err = (lp - lp_ref[rows]).abs().max().item()
    ref_grads = {canonical_name(n): q.grad for n, q in ref.named_parameters()}
    for n, q in model.named_parameters():
        err = max(err, (full(q.grad) - ref_grads[canonical_name(n)]).abs().max().item())
    return err


def check_exact_kl(cfg, par, dims) -> float:
    """``titan.token_kl`` (the exact per-position KL summed over the vocabulary, ``kl/init_exact``) of a policy
    against a frozen model equals one process's: FSDP's output layer unsharded inside the forward and copied, TP's
    vocab-sharded one gathered. Data-parallel ranks each take half the rows; TP ranks all take them all."""
    ref_p, ref_q = build(cfg, seed=0), build(cfg, seed=1, requires_grad=False)
    p, q = build(cfg, par, dims, seed=0), build(cfg, par, dims, seed=1, requires_grad=False)
    tokens = batch()
    select = torch.arange(tokens.shape[1] - 1)[None, :] >= torch.arange(tokens.shape[0])[:, None] * 2
    want = titan.token_kl(ref_p, ref_q, tokens, select_BT=select, temperature=0.7)
    if par.tensor_parallel_degree > 1:
        rows = slice(None)
    else:
        half = tokens.shape[0] // dims.world_size
        rows = slice(dist.get_rank() * half, (dist.get_rank() + 1) * half)
    got = titan.token_kl(p, q, tokens[rows], select_BT=select[rows], temperature=0.7)
    assert float(want.min()) >= 0 and float(want.max()) > 0.01, want  # two models apart: a KL to compare
    return (got - want[rows]).abs().max().item()


def check_lerp(cfg, par, dims) -> float:
    """EMA step and hard reset on sharded models equal the single-process result, read back through
    FSDP's sharded parameters (what the optimizer and the next all-gather see)."""
    dst_ref, src_ref = build(cfg, seed=0), build(cfg, seed=1)
    dst, src = build(cfg, par, dims, seed=0), build(cfg, par, dims, seed=1)
    # A forward without backward can leave FSDP holding full-weight copies (always with
    # fsdp_reshard_after_forward=never); lerp must update the shards, not those copies.
    with torch.no_grad():
        titan.token_logprobs(dst, batch())
    titan.token_logprobs(src, batch())
    titan.lerp_weights_(dst_ref, src_ref, 0.3)
    titan.lerp_weights_(dst, src, 0.3)
    want = dict(dst_ref.named_parameters())
    err = max((p - want[n]).abs().max().item() for n, p in sharded_params(dst).items())
    titan.lerp_weights_(dst, src, 1.0)
    src_params = sharded_params(src)
    exact = all(torch.equal(p, src_params[n]) for n, p in sharded_params(dst).items())
    return err if exact else float("inf")


def check_decode(cfg, par, dims) -> float:
    """Greedy KV-cache decoding (FSDP: unsharded weights; TP: each rank caches its own heads) equals
    single-process decoding step by step."""
    ref, model = build(cfg, requires_grad=False), build(cfg, par, dims, requires_grad=False)
    lens = torch.tensor([5, 2, 3])
    prompt = torch.randint(0, V, (3, 5), generator=torch.Generator().manual_seed(2))
    out_ref, st_ref = titan.prefill(ref, prompt, lens)
    out, st = titan.prefill(model, prompt, lens)
    if par.tensor_parallel_degree > 1:  # the cache holds this rank's KV heads only
        assert st.keys[0].shape[1] == st_ref.keys[0].shape[1] // par.tensor_parallel_degree, st.keys[0].shape
        assert st.plain is None, "TP decodes through the sub-modules (DTensor weights)"
    else:
        assert st.plain is not None, "FSDP's unsharded weights are plain tensors: the one-token step applies"
    err = (out - out_ref).abs().max().item()
    for _ in range(4):
        nxt = out_ref.argmax(-1)
        out_ref, st_ref = titan.decode_step(ref, nxt, st_ref)
        out, st = titan.decode_step(model, nxt, st)
        err = max(err, (out - out_ref).abs().max().item())
    titan.finish_decode(st)
    assert all(isinstance(p, DTensor) for p in model.parameters()), "finish_decode reshards"
    # Resharded: the model scores as before, and a frozen model reshards after every forward.
    err = max(err, (titan.token_logprobs(model, batch()) - titan.token_logprobs(ref, batch())).abs().max().item())
    assert all(isinstance(p, DTensor) for p in model.parameters()), "frozen FSDP model resharded after forward"
    return err


def check_generate(cfg, par, dims) -> float:
    """sampler.generate, greedy and sampled (per-row keys, temperature and top-p), gives the
    single-process tokens exactly (else inf); returns the largest behaviour log-prob difference. Without TP
    also with rollout.static_decode (FSDP's unsharded weights; each generation's first step of a bucket in
    ``setup_timeout``)."""
    from refexp.components import sampler
    from refexp.tasks.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    cfg = dataclasses.replace(cfg, vocab_size=tok.vocab_size)
    ref, model = (titan.build_model(cfg, vocab_size=tok.vocab_size, device="cpu", seed=0, mesh=d, parallelism=p,
                                    requires_grad=False) for p, d in ((None, None), (par, dims)))
    prompts = ["12+34=", "5+6=", "123+456=", "7="]  # different lengths: left padding
    keys = [(0, 1, i, 0) for i in range(len(prompts))]
    err = 0.0
    static = [dict(static_decode=True, static_capacity=24)] if par.tensor_parallel_degree == 1 else []
    for kw in (dict(greedy=True), dict(temperature=0.7, top_p=0.9, keys=keys),
               *(dict(greedy=True, **s) for s in static), *(dict(keys=keys, **s) for s in static)):
        want = sampler.generate(ref, tok, prompts, max_new_tokens=8,
                                **{k: v for k, v in kw.items() if "static" not in k})
        got = sampler.generate(model, tok, prompts, max_new_tokens=8, **kw)
        if not torch.equal(got.tokens_BT, want.tokens_BT):
            return float("inf")
        err = max(err, (got.behaviour_logp - want.behaviour_logp).abs().max().item())
    return err


def _count_hf_reads():
    """Patch DCP's HuggingFaceStorageReader to count the elements this rank reads; returns (counter, undo)."""
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    original = HuggingFaceStorageReader._process_read_request
    read = [0]

    def counting(self, f, req, planner):
        read[0] += int(torch.tensor(req.lengths).prod())
        return original(self, f, req, planner)

    HuggingFaceStorageReader._process_read_request = counting
    return read, lambda: setattr(HuggingFaceStorageReader, "_process_read_request", original)


def check_hf_roundtrip(cfg, par, dims, workdir) -> float:
    """export_hf of a sharded model (split into an indexed file set by a tiny max_shard_bytes) writes
    the single-process model's tensors; load_hf_weights_ of that set into a sharded model of other
    weights restores its log-probs, each rank reading exactly the elements of its own shards."""
    import glob

    from safetensors.torch import load_file

    ref, model = build(cfg), build(cfg, par, dims)
    a, b = os.path.join(workdir, f"{cfg.name}_ref"), os.path.join(workdir, f"{cfg.name}_sharded")
    titan.export_hf(ref, cfg, a)
    titan.export_hf(model, cfg, b, max_shard_bytes=40_000)
    sa = load_file(os.path.join(a, "model.safetensors"))
    files = glob.glob(os.path.join(b, "model-*.safetensors"))
    assert len(files) > 1 and os.path.isfile(os.path.join(b, "model.safetensors.index.json")), files
    sb = {k: v for f in files for k, v in load_file(f).items()}
    assert sa.keys() == sb.keys(), (sorted(sa), sorted(sb))
    err = max((sa[k] - sb[k]).abs().max().item() for k in sa)
    other = build(cfg, par, dims, seed=5)
    read, undo = _count_hf_reads()
    try:
        titan.load_hf_weights_(other, cfg, b)
    finally:
        undo()
    own = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in other.parameters())
    assert read[0] == own, f"rank {dist.get_rank()} read {read[0]} elements, owns {own}"
    return max(err, (titan.token_logprobs(other, batch()) - titan.token_logprobs(ref, batch())).abs().max().item())


def layouts(world: int) -> list[tuple[str, ParallelismConfig]]:
    """FSDP and TP over every rank; on 4 ranks FSDP x TP 2 x 2 instead."""
    if world == 4:
        return [("fsdp_tp", ParallelismConfig(data_parallel_shard_degree=2, tensor_parallel_degree=2))]
    return [("fsdp", ParallelismConfig(data_parallel_shard_degree=world)),
            ("tp", ParallelismConfig(data_parallel_shard_degree=1, tensor_parallel_degree=world))]


def run_checks(workdir: str, only: set[str] | None = None) -> dict:
    world = dist.get_world_size()
    results = {}
    for layout, par in layouts(world):
        dims = titan.make_parallel_dims(par, world, "cpu")
        for name in ("llama3", "qwen3"):
            cfg = tiny_model_config(name, vocab_size=V)
            if layout == "fsdp_tp":  # 4 KV heads: each rank's fused Q/K/V rows are whole KV groups
                cfg = dataclasses.replace(cfg, n_kv_heads=4)
            checks = {
                "logprobs_grads": lambda: check_logprobs_and_grads(cfg, par, dims),
                "logprobs_grads_selected": lambda: check_logprobs_and_grads(cfg, par, dims, selected=True),
                "shared_rows": lambda: check_shared_rows(cfg, par, dims),
                "shared_rows_selected": lambda: check_shared_rows(cfg, par, dims, selected=True),
                "exact_kl": lambda: check_exact_kl(cfg, par, dims),
                "lerp": lambda: check_lerp(cfg, par, dims),
                "lerp_unresharded": lambda: check_lerp(
                    cfg, dataclasses.replace(par, fsdp_reshard_after_forward="never"), dims),
                "decode": lambda: check_decode(cfg, par, dims),
                "generate": lambda: check_generate(cfg, par, dims),
                "hf_roundtrip": lambda: check_hf_roundtrip(cfg, par, dims, workdir),
            }
            for check, fn in checks.items():
                if only and check not in only:
                    continue
                key = f"{layout}/{name}/{check}"
                message = None
                try:
                    err = torch.tensor(float(fn()))
                except Exception:  # record and go on: one broken check should not hide the others
                    traceback.print_exc()
                    message = f"rank {dist.get_rank()}: {traceback.format_exc(limit=4)}"
                    err = torch.tensor(float("nan"))
                dist.all_reduce(err, op=dist.ReduceOp.MAX)
                results[key] = message or err.item()
    return results


def main() -> None:
    out_path, workdir = sys.argv[1], sys.argv[2]
    only = set(sys.argv[3].split(",")) if len(sys.argv) > 3 else None  # a subset of the checks, when debugging
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        results = run_checks(workdir, only)
        if dist.get_rank() == 0:
            with open(out_path, "w") as f:
                json.dump(results, f, indent=1)
    finally:
        dist.destroy_process_group()
    # Every number is on disk and the group is gone. Interpreter finalisation after these checks (DTensor, DCP,
    # HF export on gloo) sometimes aborts a rank with "terminate called without an active exception", which
    # fails the launch though nothing was wrong with the checks: leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
