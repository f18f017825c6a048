"""The GPU check's figures as a compact text table: the last lines bench/gpu/gpu_check.py prints on standard output,
which the device machine returns even when the result files do not come back.

One row per figure (``figure  value unit  key fields``): the value, and the few fields that say whether it can
be trusted (``KEY_FIELDS``: e.g. a memory figure's measured-over-plan ratio, a static-decode figure's graphs
compiled in the timed generation); a figure without a value shows its error or why it was skipped instead.
"""

from __future__ import annotations

TITLE = "gpu_check figures"
MAX_NOTE = 90  # characters of an error or a skip reason in the table (the whole text is in gpu_check.json)
KEY_FIELDS = {
    "preflight_versions": ("of", "torch", "cuda", "cudnn", "nccl"),
    "preflight_collectives": ("backend",),
    "matmul_bf16_tflops": ("dtype",),
    "train_tokens_per_s": ("compute_dtype", "step_s"),
    "train_mfu": ("peak_source", "mfu_vs_measured"),
    "ref_forward_ratio": ("flop_ratio",),
    "peak_mem_mib_ac_none": ("measured_over_plan", "planned_mib", "measure"),
    "peak_mem_mib_ac_full": ("measured_over_plan", "planned_mib", "measure"),
    "grpo_step_s": ("gen_share", "ref_fwd_share", "policy_share", "forward_s", "backward_s", "optimizer_s"),
    **{f"mem_{phase}_mib": ("planned_mib", "over_plan", "over_step_start_mib", "measure")
       for phase in ("rollout", "ref_forward", "train_forward", "train_backward", "optimizer")},
    "grpo_step_logprob_diff": ("max", "compute_dtype"),
    "grpo_3steps_s": ("gen_share", "ref_fwd_share", "policy_share"),
    "rollout_logprob_diff": ("max", "compute_dtype"),
    "gen_tokens_per_s_16": ("seconds", "compiles_timed", "stop_check_every", "attention_kernels"),
    "gen_tokens_per_s_128": ("seconds", "compiles_timed", "stop_check_every", "attention_kernels"),
    "gen_tokens_per_s_16_static": ("compiles_timed", "graphs_recorded_timed", "graphs_skipped_timed", "capture_s",
                                   "after_step_weights_moved", "graphs_recorded_after_step", "after_step_over_timed",
                                   "attention_kernels"),
    "gen_tokens_per_s_128_static": ("compiles_timed", "graphs_recorded_timed", "graphs_skipped_timed", "capture_s",
                                    "after_step_weights_moved", "graphs_recorded_after_step",
                                    "after_step_over_timed", "attention_kernels"),
}


def _fmt(x) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    if isinstance(x, (list, tuple)):  # e.g. attention kernel names: one token, so a row stays split()-able
        return ",".join(map(_fmt, x)) or "none"
    return str(x)


def figure_row(name: str, fig: dict) -> str:
    """One figure's row: ``name value unit key=value ...``, or its error / skip reason when it has no value."""
    value = fig.get("value")
    if value is None:
        why = fig.get("error") or fig.get("skipped") or "no value"
        kind = "ERROR" if fig.get("error") else "SKIPPED" if fig.get("skipped") else "NONE"
        return f"{name:<28} {'-':>10} {'':<9} {kind}: {' '.join(str(why).split())[:MAX_NOTE]}"
    keys = " ".join(f"{k}={_fmt(fig[k])}" for k in KEY_FIELDS.get(name, ()) if fig.get(k) is not None)
    return f"{name:<28} {_fmt(value):>10} {str(fig.get('unit', '')):<9} {keys}".rstrip()


def figure_table(figures: dict[str, dict], summary: dict) -> str:
    """Every figure of ``figures`` (in its order), then the summary's counts, as lines of text."""
    lines = [f"== {TITLE} ==", f"{'figure':<28} {'value':>10} {'unit':<9} key fields"]
    lines += [figure_row(name, fig) for name, fig in figures.items()]
    lines.append("== " + ", ".join(f"{k} {v}" for k, v in summary.items()) + " ==")
    return "\n".join(lines)
