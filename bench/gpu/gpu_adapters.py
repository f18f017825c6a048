"""What bench/gpu/gpu_check.py's probes read from refexp, in one place, so that each can follow refexp's interfaces
as they change (a memory plan with a line per phase, a compile counter of the static decode step).

- ``plan_config(overrides)``: the RootConfig ``refexp dry_run=true ...`` composes; ``plan_lines(overrides)``:
  ``refexp.cli.dry_run.plan_lines`` of it, as ``{line: bytes}``; ``planned_phase_peaks(cfg)``: the plan's peak per
  phase of a GRPO step, its training phase split into forward / backward / optimizer;
- ``planned_training_peak(lines)``: the plan's peak of a policy-training step (the phase line when the plan has
  one, else the whole plan's peak);
- ``compile_count()``: graphs compiled so far in this process (``torch._dynamo``'s counter);
- ``phase_split(rows)``: a GRPO run's seconds in generation, reference forward and the rest of the step, from
  its logged ``perf/*`` metrics (``refexp/record/metric_names.py``);
- ``cudagraph_counts()``: CUDA graphs recorded, re-recorded and skipped so far in this process (cudagraph trees:
  ``install_cudagraph_counter()`` first), for the static decode figures' per-generation differences;
- ``install_step_weight_recorder()``, ``step_weight_addresses()``: the addresses of the weights the last
  fixed-shape decode step read.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PEAK = "per-rank peak estimate"
# A plan that splits its peak by phase names the policy-training phase so (docs/gpus.md, "Plan the memory").
TRAINING_PHASE_LINES = ("policy training peak", "policy training", "peak: policy training", "training phase")


def plan_config(overrides: list[str]):
    """The validated RootConfig ``refexp dry_run=true <overrides>`` plans (data paths may stay unset)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from refexp.cli.dry_run import fill_data_paths
    from refexp.config import register_configs, to_object

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        dcfg = compose("config", overrides=["dry_run=true", *overrides])
    return to_object(fill_data_paths(dcfg))


def plan_lines(overrides: list[str]) -> dict[str, float]:
    """``{line: bytes}`` of the per-rank plan ``refexp dry_run=true <overrides>`` prints (meta-device models)."""
    from refexp.cli.dry_run import plan_lines as printed_lines

    return {what: float(b) for what, b, _ in printed_lines(plan_config(overrides))}


TRAINING = "policy training"
GRADIENTS, REDUCE_SCATTER = "gradients", "lm_head unit reduce-scatter"


def planned_phase_peaks(cfg) -> dict[str, tuple[float, str]]:
    """``{phase: (bytes, how)}``: ``refexp.cli.memory_plan.plan(cfg)``'s phase peaks (rollout, reference forward)
    and its training phase split the way a step passes through it: ``training forward`` holds the activations
    and logits but no gradients yet (the peak less the gradients and the lm_head unit's reduce-scatter buffer),
    ``training backward`` is the plan's training peak, ``optimizer`` what stays resident plus the gradients (the
    optimizer's own temporaries are not in the plan)."""
    from refexp.cli.memory_plan import plan

    p = plan(cfg)
    resident = sum(i.bytes for i in p.resident)
    training = {i.what: i.bytes for i in p.phases[TRAINING]}
    peak = p.phase_peak(TRAINING)
    return {"rollout": (p.phase_peak("rollout"), "rollout peak"),
            "reference forward": (p.phase_peak("reference forward"), "reference forward peak"),
            "training forward": (peak - training[GRADIENTS] - training[REDUCE_SCATTER],
                                 f"{TRAINING} peak - {GRADIENTS} - {REDUCE_SCATTER}"),
            "training backward": (peak, f"{TRAINING} peak"),
            "optimizer": (resident + training[GRADIENTS], f"held in every phase + {GRADIENTS}")}


def planned_training_peak(lines: dict[str, float]) -> tuple[float, str]:
    """(bytes, which line): the policy-training phase's peak when the plan has such a line, else the peak."""
    for name in TRAINING_PHASE_LINES:
        if name in lines:
            return lines[name], name
    return lines[PEAK], PEAK


def compile_count() -> int:
    """Graphs torch.compile has compiled in this process (a recompilation counts again)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def phase_split(rows: list[dict]) -> dict:
    """Sums over the logged training steps: ``gen_s`` (generation), ``ref_fwd_s`` (reference forward),
    ``policy_s`` (the rest of the step: old log-probs, loss, backward, optimizer, reference update) and
    ``step_s``; ``per_step`` keeps each step's three parts."""
    from refexp.record.metric_names import PERF_GEN_S, PERF_REF_FWD_S, PERF_STEP_S

    steps = [r for r in rows if PERF_STEP_S in r]
    if not steps:
        raise RuntimeError(f"no logged step has {PERF_STEP_S}")
    per_step = []
    for r in steps:
        gen, ref = r.get(PERF_GEN_S, 0.0), r.get(PERF_REF_FWD_S, 0.0)
        per_step.append({"step": r["step"], "gen_s": gen, "ref_fwd_s": ref, "policy_s": r[PERF_STEP_S] - gen - ref,
                         "step_s": r[PERF_STEP_S]})
    total = {k: sum(s[k] for s in per_step) for k in ("gen_s", "ref_fwd_s", "policy_s", "step_s")}
    return {**total, "per_step": per_step}


_RECORDED: dict = {}  # cudagraph trees' function id -> recordings of it in this process


def note_recording(function_id) -> None:
    """One CUDA-graph recording of ``function_id`` (a compiled graph's id in cudagraph trees)."""
    _RECORDED[function_id] = _RECORDED.get(function_id, 0) + 1


def install_cudagraph_counter() -> bool:
    """Count every recording cudagraph trees makes (each ``CUDAGraphNode`` is one recorded graph), once per
    process; False where this torch has no cudagraph trees."""
    try:
        from torch._inductor import cudagraph_trees as trees
    except Exception:  # noqa: BLE001 - an older or CPU-only torch: nothing is recorded
        return False
    node = getattr(trees, "CUDAGraphNode", None)
    if node is None:
        return False
    if getattr(node.__init__, "_refexp_counting", False):
        return True
    init = node.__init__

    def counting_init(self, wrapped_function, *args, **kwargs):
        note_recording(getattr(wrapped_function, "id", None))
        return init(self, wrapped_function, *args, **kwargs)

    counting_init._refexp_counting = True
    node.__init__ = counting_init
    return True


def cudagraph_counts() -> dict[str, int]:
    """``recorded``: graphs recorded; ``rerecorded``: of those, recordings of a graph already recorded (its
    static inputs moved, or a new path of the tree); ``skipped``: graphs cudagraph trees declined to record
    (``counters["inductor"]["cudagraph_skips"]``: they run without CUDA graphs). Subtract two readings for what
    happened between them."""
    from torch._dynamo.utils import counters

    recorded = sum(_RECORDED.values())
    return {"recorded": recorded, "rerecorded": recorded - len(_RECORDED),
            "skipped": int(counters["inductor"]["cudagraph_skips"])}


def counts_since(before: dict[str, int]) -> dict[str, int]:
    now = cudagraph_counts()
    return {k: now[k] - before[k] for k in now}


_STEP_READ: list = []  # the weight addresses the last fixed-shape decode step read


def install_step_weight_recorder() -> None:
    """Record the addresses of the weights each fixed-shape decode step reads (``StaticBucket.run``'s ``w``), once
    per process; ``step_weight_addresses()`` returns the last step's."""
    from refexp.titan import static_decode, static_weights

    run = static_decode.StaticBucket.run
    if getattr(run, "_refexp_recording", False):
        return

    def recording(self, w, tokens_B):
        _STEP_READ[:] = [t.data_ptr() for t, _ in static_weights._pairs(w, w)]
        return run(self, w, tokens_B)

    recording._refexp_recording = True
    static_decode.StaticBucket.run = recording


def step_weight_addresses() -> list[int]:
    """The addresses of the weights the last fixed-shape decode step read (empty before the first)."""
    return list(_STEP_READ)
