"""The GPU check's figures in one JSON file: gpu_smoke.py and the probes, each in its own process with its own
share of the time budget, so that a crash, a hang or an out-of-memory in one costs only its own figures.

Steps, in order (a step's share of what is left of the budget is its weight over the weights still to run, so
time a step does not use goes to the later ones):

- ``preflight`` runs ``gpu_preflight.py``: versions, clocks, refexp.tasks, a 1-rank collective (failed: the rest
  in float32), deterministic cumsum
- ``train`` runs ``gpu_smoke.py --only ...``: ``matmul_bf16_tflops``, ``train_tokens_per_s``, ``train_mfu``,
  ``ref_forward_ratio``
- ``memory`` runs ``gpu_probe_memory.py``: ``peak_mem_mib_ac_none``, ``peak_mem_mib_ac_full`` (each against the
  dry-run plan)
- ``grpo_step`` runs ``gpu_probe_grpo_step.py``: ``grpo_step_s`` (one in-process GRPO step at 0.6B shape:
  generation / reference / policy shares), ``mem_*_mib`` (each phase's peak beside its plan line),
  ``grpo_step_logprob_diff``
- ``grpo`` runs ``gpu_probe_grpo.py``: ``grpo_3steps_s`` (generation / reference forward / policy split),
  ``rollout_logprob_diff``
- ``decode`` runs ``gpu_smoke.py --only ...``: ``gen_tokens_per_s_{16,128}`` and ``..._static`` (compile counts,
  capture seconds)

A step gets ``--budget-s`` = 80% of its share (gpu_smoke's ``Runner`` skips the figures that would start
later) and is killed, with its process group, at its share; the lines it printed by then are kept. Every
figure of the list is in the output: a figure its step never printed gets ``"value": null`` and the reason.
Output, at most ``MAX_RESULT_FILES`` files (what the device machine returns): ``OUT/gpu_check.json`` (``env``,
``deps`` from ``OUT/deps.json`` when gpu_check.sh's install step wrote it, ``figures``, ``steps``, ``summary``)
and ``OUT/gpu_check.log``, every step's standard output and error one after the other under a header line. The
last lines of standard output are the table of every figure (bench/gpu/gpu_table.py): the machine returns standard
output even when it does not return the files.

    python bench/gpu/gpu_check.py OUT [--budget-s N] [--toy]     # bench/gpu_check.sh calls it so
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

GPU_DIR = Path(__file__).resolve().parent  # bench/gpu/: the steps' scripts
sys.path.insert(0, str(GPU_DIR))

from gpu_table import figure_table  # noqa: E402

MAX_BUDGET_S = 360.0
MAX_RESULT_FILES = 8  # the device machine returns at most 8 files of a command's $OUT
LOG = "gpu_check.log"
CHILD_BUDGET_FRACTION = 0.8  # the rest of a share: the child's start-up (torch, refexp) and a margin


@dataclass(frozen=True)
class Step:
    name: str
    script: str
    figures: tuple[str, ...]
    weight: float
    smoke_only: bool = False  # gpu_smoke.py: pass the figures as --only
    toy_args: tuple[str, ...] = ()


STEPS = (
    # versions, clocks, a 1-rank collective, deterministic cumsum: a failed collective runs the rest in float32;
    # weight 0.7 of 12.2 keeps its ~18 s box (of 315 s) now that grpo_step shares the budget
    Step("preflight", "gpu_preflight.py", ("preflight_versions", "preflight_refexp_tasks", "preflight_collectives",
                                           "preflight_deterministic_cumsum"), weight=0.7),
    Step("train", "gpu_smoke.py", ("matmul_bf16_tflops", "train_tokens_per_s", "train_mfu", "ref_forward_ratio"),
         weight=2.0, smoke_only=True),
    Step("memory", "gpu_probe_memory.py", ("peak_mem_mib_ac_none", "peak_mem_mib_ac_full"), weight=1.5),
    # one GRPO step in process at the 0.6B shape: time shares, memory by phase against the plan, log-prob mismatch;
    # bfloat16 at toy size too, so the mismatch is the CUDA path's dtype
    Step("grpo_step", "gpu_probe_grpo_step.py", ("grpo_step_s", "mem_rollout_mib", "mem_ref_forward_mib",
                                                 "mem_train_forward_mib", "mem_train_backward_mib", "mem_optimizer_mib",
                                                 "grpo_step_logprob_diff"), weight=1.5,
         toy_args=("--mixed-precision", "bfloat16")),
    # at toy size on CPU too, the log-prob difference is the bfloat16 one (the CUDA code path, a 1-rank mesh)
    Step("grpo", "gpu_probe_grpo.py", ("grpo_3steps_s", "rollout_logprob_diff"), weight=3.0,
         toy_args=("--mixed-precision", "bfloat16")),
    # bfloat16 at toy size too: the FSDP-wrapped policy whose gathered weights the static path keeps a copy of
    Step("decode", "gpu_smoke.py", ("gen_tokens_per_s_16", "gen_tokens_per_s_128", "gen_tokens_per_s_16_static",
                                    "gen_tokens_per_s_128_static"), weight=3.5, smoke_only=True,
         toy_args=("--mixed-precision", "bfloat16")),
)
FIGURES = tuple(f for s in STEPS for f in s.figures)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="folder for gpu_check.json and the steps' logs")
    p.add_argument("--budget-s", type=float, default=300.0, help=f"wall-clock budget, at most {MAX_BUDGET_S:.0f}")
    p.add_argument("--toy", action="store_true", help="toy sizes on CPU, one thread (minutes -> seconds)")
    p.add_argument("--steps", type=lambda v: tuple(x for x in v.split(",") if x), default=tuple(s.name for s in STEPS),
                   help="only these steps, comma-separated (a rerun): " + ", ".join(s.name for s in STEPS))
    args = p.parse_args(argv)
    if not 0 < args.budget_s <= MAX_BUDGET_S:
        p.error(f"--budget-s must be in (0, {MAX_BUDGET_S:.0f}], got {args.budget_s:g}")
    unknown = set(args.steps) - {s.name for s in STEPS}
    if unknown or not args.steps:
        p.error(f"--steps: unknown {sorted(unknown)}; choose from {', '.join(s.name for s in STEPS)}")
    return args


def step_command(step: Step, budget_s: float, toy: bool, fp32: bool = False) -> list[str]:
    """``fp32``: the preflight's collective failed, so no FSDP mixed precision (it needs a process group)."""
    cmd = [sys.executable, str(GPU_DIR / step.script), "--budget-s", f"{budget_s:.1f}"]
    if step.smoke_only:
        cmd += ["--only", *step.figures]
    if toy:
        cmd += ["--toy", "--device", "cpu", "--threads", "1", *(() if fp32 else step.toy_args)]
    if fp32:
        cmd += ["--mixed-precision", "float32"]
    return cmd


CLOCKS_QUERY = "driver_version,clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw"


def gpu_clocks() -> dict | None:
    """``nvidia-smi``'s driver version, clocks (MHz), temperature and power of the first GPU; None without it."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={CLOCKS_QUERY}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0 or not out.stdout.strip():
        return None
    return dict(zip(CLOCKS_QUERY.split(","), (v.strip() for v in out.stdout.splitlines()[0].split(","))))


def run_step(step: Step, box_s: float, args, work: Path, log: Path) -> tuple[list[dict], dict]:
    """(the JSON lines the step printed, its record): killed with its process group after ``box_s``. Its output
    is written in ``work`` as it runs, then appended to the merged ``log``."""
    cmd = step_command(step, CHILD_BUDGET_FRACTION * box_s, args.toy, args.fp32)
    out_path, err_path = work / f"{step.name}.out", work / f"{step.name}.err"
    t0 = time.monotonic()
    timed_out = False
    with open(out_path, "w") as out, open(err_path, "w") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, start_new_session=True)
        try:
            rc = p.wait(timeout=box_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(p.pid, signal.SIGKILL)  # its own session: the end-to-end run's subprocess goes too
            rc = p.wait()
    lines = []
    for raw in out_path.read_text(errors="replace").splitlines():
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and "figure" in obj:
            lines.append(obj)
    record = {"seconds": round(time.monotonic() - t0, 1), "box_s": round(box_s, 1), "rc": rc,
              "timed_out": timed_out, "command": " ".join(cmd[1:])}
    with open(log, "a") as merged:
        for what, path in (("stdout", out_path), ("stderr", err_path)):
            merged.write(f"===== step {step.name}: {what} (rc {rc}{', timed out' if timed_out else ''}) =====\n")
            text = path.read_text(errors="replace")
            merged.write(text if text.endswith("\n") or not text else text + "\n")
    return lines, record


def compile_caches() -> dict:
    """Where inductor and triton keep compiled kernels (gpu_check.sh pins them) and how many files each holds."""
    out = {}
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        path = os.environ.get(var)
        out[var] = {"path": path, "files": sum(1 for p in Path(path).rglob("*") if p.is_file())
                    if path and Path(path).is_dir() else None}
    return out


def result_files(out: Path) -> list[Path]:
    """Every file under ``out``, subfolders included: what the device machine would have to return."""
    return sorted(p for p in out.rglob("*") if p.is_file())


def main(argv=None) -> dict:
    args = parse_args(argv)
    args.fp32 = False
    t0 = time.monotonic()
    deadline = t0 + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / LOG
    log.write_text("")
    result = {"schema": "refexp-gpu-check/1", "toy": args.toy, "budget_s": args.budget_s,
              "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "env": None, "deps": None,
              "figures": {}, "steps": {}}
    result["compile_caches"] = compile_caches()  # warm (files from an earlier call) or cold
    deps = args.out / "deps.json"
    if deps.exists():
        result["deps"] = json.loads(deps.read_text())
    steps = [s for s in STEPS if s.name in args.steps]
    for i, step in enumerate(steps):
        left = deadline - time.monotonic()
        box = left * step.weight / sum(s.weight for s in steps[i:])
        if box < 1.0:
            result["steps"][step.name] = {"skipped": f"out of time: {max(left, 0):.0f} s of the budget left"}
            continue
        with tempfile.TemporaryDirectory(prefix="gpu_check_step_") as work:
            lines, record = run_step(step, box, args, Path(work), log)
        result["steps"][step.name] = record
        if step.name == "preflight" and not any(x.get("figure") == "preflight_collectives" and x.get("value")
                                                is not None for x in lines):
            args.fp32 = True  # no process group: the later steps' models stay plain float32 modules
            result["fallback"] = "float32: the preflight's 1-rank collective failed (see preflight_collectives)"
            print(f"gpu_check: {result['fallback']}", file=sys.stderr, flush=True)
        for line in lines:
            name = line.pop("figure")
            if name == "env" and result["env"] is None:
                result["env"] = line
            elif name in step.figures:
                result["figures"][name] = line
        print(f"gpu_check: {step.name}: {record['seconds']} s of {record['box_s']} s, rc {record['rc']}",
              file=sys.stderr, flush=True)
    for step in steps:  # a figure never printed: its step died, timed out or did not start
        rec = result["steps"][step.name]
        why = rec.get("skipped") or ("timed out" if rec.get("timed_out") else f"exit {rec.get('rc')}")
        for name in step.figures:
            result["figures"].setdefault(name, {"value": None, "error": f"step {step.name} printed no line for it "
                                                                        f"({why}; see {LOG})"})
    result["figures"] = figs = {n: result["figures"][n] for n in FIGURES if n in result["figures"]}
    result["summary"] = {"ok": sum(1 for f in figs.values() if f.get("value") is not None),
                         "error": sum(1 for f in figs.values() if f.get("error")),
                         "skipped": sum(1 for f in figs.values() if f.get("skipped")),
                         "elapsed_s": round(time.monotonic() - t0, 1)}
    result["gpu_clocks_end"] = gpu_clocks()  # the preflight's are the start's
    (args.out / "gpu_check.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    files = result_files(args.out)
    if len(files) > MAX_RESULT_FILES:  # the machine would drop some: say which, where it is returned
        print(f"gpu_check: warning: {len(files)} files in {args.out}, over the {MAX_RESULT_FILES} the device "
              f"machine returns: {', '.join(str(p.relative_to(args.out)) for p in files)}", file=sys.stderr)
    print(f"gpu_check: {result['summary']} -> {args.out / 'gpu_check.json'}", file=sys.stderr, flush=True)
    print(figure_table(result["figures"], result["summary"]), flush=True)  # the last lines of standard output
    return result


if __name__ == "__main__":
    main()
