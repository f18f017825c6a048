"""What bench/gpu_check.py's probes read from refexp, in one place, so that each can follow refexp's interfaces
as they change (a memory plan with a line per phase, a compile counter of the static decode step).

- ``plan_lines(overrides)``: ``refexp.cli.dry_run.plan_lines`` of a config composed as ``refexp dry_run=true ...`` composes
  it, as ``{line: bytes}``;
- ``planned_training_peak(lines)``: the plan's peak of a policy-training step (the phase line when the plan has
  one, else the whole plan's peak);
- ``compile_count()``: graphs compiled so far in this process (``torch._dynamo``'s counter);
- ``phase_split(rows)``: a GRPO run's seconds in generation, reference forward and the rest of the step, from
  its logged ``perf/*`` metrics (``refexp/record/metric_names.py``).
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEAK = "per-rank peak estimate"
# A plan that splits its peak by phase names the policy-training phase so (docs/gpus.md, "Plan the memory").
TRAINING_PHASE_LINES = ("policy training peak", "policy training", "peak: policy training", "training phase")


def plan_lines(overrides: list[str]) -> dict[str, float]:
    """``{line: bytes}`` of the per-rank plan ``refexp dry_run=true <overrides>`` prints (meta-device models)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from refexp.cli.dry_run import fill_data_paths
    from refexp.cli.dry_run import plan_lines as printed_lines
    from refexp.config import register_configs, to_object

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        dcfg = compose("config", overrides=["dry_run=true", *overrides])
    return {what: float(b) for what, b, _ in printed_lines(to_object(fill_data_paths(dcfg)))}


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
