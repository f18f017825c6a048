"""The GPU check (bench/gpu_check.sh) at toy size on CPU, and what it rests on: a ``logger=none`` run needs only
what the GPU machine has plus bench/gpu/gpu_wheels.txt (neither wandb nor optuna), and the phase split of a GRPO
run's logged times."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from refexp.config import RolloutConfig

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"  # the entry scripts (gpu_check.sh, gpu_slot.sh)
GPU = BENCH / "gpu"  # the check's modules and lists
sys.path[:0] = [str(GPU), str(BENCH)]

import gpu_adapters  # noqa: E402
import gpu_check  # noqa: E402
import gpu_probe_grpo_step  # noqa: E402
import gpu_smoke  # noqa: E402
import gpu_table  # noqa: E402

COUNTS = {"compiles_first", "compiles_timed", "compiles_in_process"}  # may be 0: eager on CPU


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@pytest.mark.slow
def test_toy_gpu_check_writes_every_figure_finite_and_positive(tmp_path):
    out = tmp_path / "out"
    p = subprocess.run(["bash", str(BENCH / "gpu_check.sh"), "--toy", str(out), "--budget-s", "240"], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    # what the device machine returns: at most 8 files, one of them the install step's, which --toy skips
    files = sorted(str(f.relative_to(out)) for f in out.rglob("*") if f.is_file())
    assert files == ["gpu_check.json", gpu_check.LOG] and len(files) <= gpu_check.MAX_RESULT_FILES - 1
    log = (out / gpu_check.LOG).read_text()
    for step in gpu_check.STEPS:  # every step's output in the merged log, under its header
        assert f"===== step {step.name}: stdout (rc 0) =====" in log and f"===== step {step.name}: stderr" in log
    result = json.loads((out / "gpu_check.json").read_text())
    figs = result["figures"]
    assert list(figs) == list(gpu_check.FIGURES)
    # standard output (returned even when the files are not) ends with the table of every figure and its value
    table = p.stdout.rstrip("\n").splitlines()[-(len(gpu_check.FIGURES) + 3):]
    assert table[0] == f"== {gpu_table.TITLE} ==" and table[-1].startswith(f"== ok {len(figs)}, error 0")
    for row, (name, fig) in zip(table[2:-1], figs.items()):
        assert row.split()[:2] == [name, gpu_table._fmt(fig["value"])], row
    table_rows = {row.split()[0]: row for row in table[2:-1]}
    for name, fig in figs.items():
        assert fig.get("error") is None and fig.get("skipped") is None, (name, fig)
        assert _finite(fig["value"]) and fig["value"] > 0, (name, fig)
    assert result["env"]["toy"] is True and result["env"]["refexp_titan_import"] == "ok"
    assert "fallback" not in result and figs["preflight_collectives"]["backend"] == "gloo"
    assert result["summary"]["ok"] == len(gpu_check.FIGURES) and result["summary"]["elapsed_s"] <= 240
    assert all(s["rc"] == 0 and not s["timed_out"] for s in result["steps"].values())

    for ac in ("none", "full"):  # each measured step against the dry-run plan of the same shape
        mem = figs[f"peak_mem_mib_ac_{ac}"]
        assert mem["activation_checkpoint"] == ac and mem["plan_mib"]["activations"] > 0
        assert mem["planned_mib"] > mem["planned_step_extra_mib"] > 0 and mem["measured_over_plan"] > 0
    assert figs["peak_mem_mib_ac_full"]["plan_mib"]["activations"] < figs["peak_mem_mib_ac_none"]["plan_mib"][
        "activations"]

    step = figs["grpo_step_s"]  # one in-process GRPO step at the toy shape, split by phase
    assert (step["prompts"], step["group_size"]) == gpu_probe_grpo_step.ROWS[True]
    assert step["gen_share"] + step["ref_fwd_share"] + step["policy_share"] == pytest.approx(1, abs=1e-3)
    assert all(step[k] > 0 for k in ("gen_s", "ref_fwd_s", "policy_s", "forward_s", "backward_s", "optimizer_s"))
    assert step["forward_s"] + step["backward_s"] + step["optimizer_s"] <= step["policy_s"] * 1.05
    for name in gpu_probe_grpo_step.PHASE_FIGURES.values():  # each phase's peak beside its plan line
        mem = figs[name]
        assert mem["measure"] == "rss_hwm" and "over_plan" not in mem and mem["planned_mib"] > 0, (name, mem)
        assert f"planned_mib={gpu_table._fmt(mem['planned_mib'])}" in table_rows[name]
    assert figs["mem_train_backward_mib"]["planned_line"] == "policy training peak"
    diff = figs["grpo_step_logprob_diff"]
    assert diff["compute_dtype"] == "bfloat16" and diff["max"] >= diff["value"] > 0

    grpo = figs["grpo_3steps_s"]
    assert [s["step"] for s in grpo["per_step"]] == [1, 2, 3]
    for s in grpo["per_step"]:  # the parts add up to the step, and each part took time
        assert s["gen_s"] > 0 and s["ref_fwd_s"] > 0 and s["policy_s"] > 0
        assert s["gen_s"] + s["ref_fwd_s"] + s["policy_s"] == pytest.approx(s["step_s"], abs=2e-4)
    assert grpo["gen_share"] + grpo["ref_fwd_share"] + grpo["policy_share"] == pytest.approx(1, abs=1e-3)
    diff = figs["rollout_logprob_diff"]
    assert diff["compute_dtype"] == "bfloat16" and len(diff["per_step"]) == 3 and diff["max"] >= diff["value"]

    for rows in gpu_smoke.GEN_ROWS:
        eager, static = figs[f"gen_tokens_per_s_{rows}"], figs[f"gen_tokens_per_s_{rows}_static"]
        assert eager["rows"] == static["rows"] == rows and static["static_decode"] is True
        assert eager["generated_tokens"] == static["generated_tokens"] == rows * gpu_smoke.TOY.new_tokens
        for name in (f"gen_tokens_per_s_{rows}", f"gen_tokens_per_s_{rows}_static"):
            fig = figs[name]  # decoded as a GPU run decodes: padded prompts, its stop-check interval
            assert fig["stop_check_every"] == RolloutConfig().stop_check_interval("cuda") > 1
            assert fig["prompt_lens"]["min"] < fig["prompt_lens"]["max"] == gpu_smoke.TOY.prompt_len
            # the profiler's attention operators: SDPA and the backend it dispatched to
            assert "aten::scaled_dot_product_attention" in fig["attention_kernels"], fig["attention_kernels"]
            assert any(k.startswith("aten::_scaled_dot_product_") for k in fig["attention_kernels"])
            assert fig["profiled_compiles"] == 0
            assert f"attention_kernels={','.join(fig['attention_kernels'])}" in table_rows[name]
        assert all(_finite(static[k]) and static[k] >= 0 for k in COUNTS) and _finite(static["capture_s"])
        # the timed generation and the one after a training step replay what the first recorded, on weights
        # that stayed put (the FSDP-wrapped bf16 policy's kept copy; CUDA graphs themselves exist only on CUDA)
        assert all(static[f"graphs_{k}_{when}"] == 0 for k in ("recorded", "rerecorded", "skipped")
                   for when in ("timed", "after_step"))
        assert static["after_step_weights_moved"] is False and _finite(static["after_step_tokens_per_s"])


def test_the_figure_table_shows_a_value_with_its_key_fields_and_a_missing_one_with_its_reason():
    figs = {"gen_tokens_per_s_16_static": {"value": 1234.5678, "unit": "tokens/s", "compiles_timed": 0,
                                           "compiles_first": 3, "capture_s": 41.0, "seconds": 2.0,
                                           "graphs_recorded_timed": 0, "after_step_weights_moved": False,
                                           "attention_kernels": ["aten::sdpa", "fmha_cutlassF"]},
            "peak_mem_mib_ac_none": {"value": None, "error": "OutOfMemoryError: CUDA out of\nmemory " + "x" * 200},
            "train_mfu": {"value": None, "skipped": "out of time: 0 s of the budget left"}}
    lines = gpu_table.figure_table(figs, {"ok": 1, "error": 1, "skipped": 1}).splitlines()
    assert lines[2].split() == ["gen_tokens_per_s_16_static", "1235", "tokens/s", "compiles_timed=0",
                                "graphs_recorded_timed=0", "capture_s=41", "after_step_weights_moved=False",
                                "attention_kernels=aten::sdpa,fmha_cutlassF"]
    assert lines[3].split()[:5] == ["peak_mem_mib_ac_none", "-", "ERROR:", "OutOfMemoryError:", "CUDA"]
    assert len(lines[3]) < 160  # one line, the error cut short (gpu_check.json has all of it)
    assert "SKIPPED: out of time" in lines[4] and lines[-1] == "== ok 1, error 1, skipped 1 =="


def test_the_grpo_step_is_planned_at_its_own_shape_and_each_phase_reads_the_plans_lines():
    """The in-process GRPO step's config is the plan's: 16 x 8 rows of 128 + 128 tokens at the Qwen3-0.6B shape on
    a GPU (the plan fits an H200), and each phase's planned peak is made of the dry-run plan's printed lines."""
    import torch

    from refexp.cli.dry_run import plan_lines

    gpu = gpu_smoke.Bench(gpu_smoke.parse_args([]), torch.device("cuda"))  # nothing runs: the plan is meta-only
    cfg = gpu_adapters.plan_config(gpu_probe_grpo_step.overrides(gpu))
    assert (cfg.algo.prompts_per_step, cfg.algo.group_size, cfg.task.max_prompt_len, cfg.task.max_new_tokens,
            cfg.model.flavor, cfg.reference.name) == (16, 8, 128, 128, "0.6B", "fixed")
    planned = {k: b for k, (b, _) in gpu_adapters.planned_phase_peaks(cfg).items()}
    assert list(planned) == list(gpu_probe_grpo_step.PHASE_FIGURES)
    assert 40 * 2**30 < planned["training backward"] < 139 * 2**30  # the H200's memory
    lines = {what: b for what, b, _ in plan_lines(cfg)}
    assert planned["rollout"] == lines["rollout peak"] and planned["training backward"] == lines["policy training peak"]
    assert planned["reference forward"] == lines["reference forward peak"]
    # forward: no gradients yet; the optimizer: what stays resident and the gradients, no activations
    assert planned["training forward"] == pytest.approx(lines["policy training peak"] - lines["gradients"]
                                                        - lines["lm_head unit reduce-scatter"])
    resident = sum(lines[k] for k in ("parameters", "optimizer state", "reference", "kl/init anchor"))
    assert planned["optimizer"] == pytest.approx(resident + lines["gradients"])
    # the reference forward holds only one chunk of selected logits beside what is resident, less than the
    # optimizer step's resident weights and gradients; the rollout's KV cache and the training activations more
    assert planned["reference forward"] < planned["optimizer"] < planned["rollout"] < planned["training forward"]


def test_after_a_failed_preflight_collective_the_steps_run_in_float32():
    """No process group, no FSDP mixed precision: the steps after the preflight build plain float32 models."""
    decode = next(s for s in gpu_check.STEPS if s.name == "decode")
    assert gpu_check.step_command(decode, 10, toy=True)[-2:] == ["--mixed-precision", "bfloat16"]
    fp32 = gpu_check.step_command(decode, 10, toy=True, fp32=True)
    assert fp32[-2:] == ["--mixed-precision", "float32"] and "bfloat16" not in fp32
    assert gpu_check.step_command(decode, 10, toy=False, fp32=True)[-2:] == ["--mixed-precision", "float32"]


@pytest.mark.slow
def test_the_slots_second_step_reruns_decode_and_what_the_first_did_not_finish(tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "step1.json").write_text(json.dumps({"steps": {"preflight": {"rc": 0, "timed_out": False},
                                                           "train": {"skipped": "out of time"},
                                                           "memory": {"rc": 0, "timed_out": False}}}))
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    env.update(REFEXP_GPU_KEEP=str(keep), GPU_SLOT_ARGS="--toy")  # the caches: under KEEP unless set otherwise
    p = subprocess.run(["bash", str(BENCH / "gpu_slot.sh"), "2", str(tmp_path / "out")], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "gpu_slot: step 2 runs --steps decode,train" in p.stderr, p.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert set(result["steps"]) == {"train", "decode"}, result["steps"]
    assert all(v["path"].startswith(str(keep / "caches")) for v in result["compile_caches"].values())
    assert len(result["figures"]) == 8 and p.stdout.rstrip("\n").splitlines()[-1].startswith("== ok"), p.stdout


def test_gpu_check_refuses_a_budget_over_six_minutes(tmp_path):
    p = subprocess.run(["bash", str(BENCH / "gpu_check.sh"), str(tmp_path), "--budget-s", "361"], cwd=REPO,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "--budget-s must be a number of seconds in (0, 360]" in p.stderr
    assert not (tmp_path / "gpu_check.json").exists()


def test_phase_split_sums_the_logged_step_times_by_phase():
    rows = [{"step": 0, "eval/accuracy": 0.5},  # an evaluation row: no step time
            {"step": 1, "perf/gen_s": 2.0, "perf/ref_fwd_s": 0.5, "perf/step_s": 4.0},
            {"step": 2, "perf/gen_s": 1.0, "perf/step_s": 3.0}]  # no reference forward logged: 0
    split = gpu_adapters.phase_split(rows)
    assert (split["gen_s"], split["ref_fwd_s"], split["policy_s"], split["step_s"]) == (3.0, 0.5, 3.5, 7.0)
    assert split["per_step"][1] == {"step": 2, "gen_s": 1.0, "ref_fwd_s": 0.0, "policy_s": 2.0, "step_s": 3.0}
    with pytest.raises(RuntimeError, match="perf/step_s"):
        gpu_adapters.phase_split(rows[:1])


def _names(path: Path) -> set[str]:
    """Normalised distribution names of a list file (``name==version  # comment`` or ``name`` per line)."""
    out = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.add(re.sub(r"[-_.]+", "-", line.split("==")[0]).lower())
    return out


# Runs refexp's CLI with every distribution outside the allowed set unimportable (as on the GPU machine with
# the wheels installed), then prints what was imported and what was refused.
_CHILD = r"""
import importlib.metadata as md, json, re, sys
allowed = set(json.loads(sys.argv[1]))
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
owners = md.packages_distributions()
refused = set()
class NotOnTheMachine:  # wraps each finder: a refused module is not found, as where it is not installed
    def __init__(self, finder):
        self.finder = finder
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        dists = owners.get(top)
        if dists and not any(norm(d) in allowed for d in dists):
            refused.add(top)
            return None
        find = getattr(self.finder, "find_spec", None)
        return find(name, path, target) if find else None
    def find_distributions(self, *args, **kwargs):  # their metadata is gone too
        find = getattr(self.finder, "find_distributions", None)
        return (d for d in (find(*args, **kwargs) if find else ()) if norm(d.metadata["Name"] or "") in allowed)
    def invalidate_caches(self):
        getattr(self.finder, "invalidate_caches", lambda: None)()
sys.meta_path[:] = [NotOnTheMachine(f) for f in sys.meta_path]
sys.argv = ["refexp", *sys.argv[2:]]
from refexp.__main__ import main
try:
    main()
finally:
    print("IMPORTED " + json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
    print("REFUSED " + json.dumps(sorted(refused)))
"""


@pytest.mark.slow
def test_a_logger_none_run_needs_only_the_gpu_machine_and_the_wheel_list(tmp_path):
    allowed = _names(GPU / "gpu_machine.txt") | _names(GPU / "gpu_wheels.txt") | {"refexp"}
    assert not {"wandb", "optuna"} & allowed  # a 34 MB wheel and an optional sweeper: not carried
    overrides = ["debug=fast", "algo=grpo", "logger=none", "logger.progress=false", "model.dim=32",
                 "model.ffn_hidden_dim=64", "model.n_heads=2", "model.n_kv_heads=2", "sft.steps=2", "sft.eval_every=2",
                 "sft.batch_size=8", "task.num_train=100", "task.num_eval=8", "eval.num_prompts=4",
                 "eval.kl_prompts=2", "algo.prompts_per_step=2", "algo.group_size=2", "training.steps=1",
                 "training.num_threads=1", f"run_dir={tmp_path / 'run'}", f"hydra.run.dir={tmp_path / 'hydra'}",
                 f"sft.cache_dir={tmp_path / 'cache'}"]
    p = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(sorted(allowed)), *overrides], cwd=REPO,
                       capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "PYTHONPATH": str(REPO), "REFEXP_CACHE": str(tmp_path)})
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    assert "[refexp] done:" in p.stdout + p.stderr
    imported = set(json.loads(p.stdout.split("IMPORTED ", 1)[1].splitlines()[0]))
    assert not {"wandb", "optuna"} & imported
    refused = set(json.loads(p.stdout.split("REFUSED ", 1)[1].splitlines()[0]))
    assert not {"wandb", "optuna"} & refused  # not even tried: the imports of W&B and Optuna stay lazy


def test_the_cuda_graph_counter_counts_recordings_rerecordings_and_skips():
    """cudagraph trees record only on CUDA: here the counter is installed on this torch's ``CUDAGraphNode``
    (once), and the counts it reads are driven by hand."""
    from torch._dynamo.utils import counters
    from torch._inductor import cudagraph_trees

    assert gpu_adapters.install_cudagraph_counter() and gpu_adapters.install_cudagraph_counter()
    assert cudagraph_trees.CUDAGraphNode.__init__._refexp_counting
    before = gpu_adapters.cudagraph_counts()
    gpu_adapters.note_recording("decode_step_8x24")  # recorded
    gpu_adapters.note_recording("decode_step_16x24")  # another graph, recorded
    gpu_adapters.note_recording("decode_step_8x24")  # the first again: its static inputs moved
    counters["inductor"]["cudagraph_skips"] += 1
    assert gpu_adapters.counts_since(before) == {"recorded": 3, "rerecorded": 1, "skipped": 1}


def test_compile_count_counts_each_compilation_once():
    import torch

    step = torch.compile(lambda x: torch.relu(x) * 2, backend="eager", dynamic=False)
    before = gpu_adapters.compile_count()
    step(torch.ones(3))
    step(torch.ones(3))  # the same shape: the compiled graph again
    assert gpu_adapters.compile_count() == before + 1
    step(torch.ones(5))  # another shape, static shapes: compiled anew
    assert gpu_adapters.compile_count() == before + 2
