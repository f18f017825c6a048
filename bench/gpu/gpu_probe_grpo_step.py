"""Probe of bench/gpu/gpu_check.py: one GRPO step in this process at the Qwen3-0.6B shape (random weights; 16 prompts x
8 completions of 128 + 128 tokens on a GPU, gpu_smoke's toy shape and 4 x 2 rows of 8 + 8 tokens at ``--toy``),
refexp's own ``GRPOStep`` with a fixed reference, timed and measured phase by phase against the memory plan of the
same config (``refexp dry_run=true``; gpu_adapters.plan_config composes both from the same overrides).

Unlike ``grpo_3steps_s`` (gpu_probe_grpo.py: the CLI on the debug model, process start and SFT stage included) this
is the step alone at the shape the plan is for. A first step pays kernel selection; the figures are the second's.

``grpo_step_s``
    Value: the second step's ``perf/step_s``. ``gen_share``, ``ref_fwd_share``, ``policy_share``: generation,
    reference forward and the rest (old log-probs, loss, backward, optimizer) over it (gpu_adapters.phase_split of
    the step's own metrics); ``forward_s``, ``backward_s``, ``optimizer_s``: the policy update's parts, from hooks
    (the policy's top-level forward in training mode, ``optimizer_step``'s call and return).
``mem_rollout_mib``, ``mem_ref_forward_mib``, ``mem_train_forward_mib``, ``mem_train_backward_mib``,
``mem_optimizer_mib``
    The peak of each phase of that step (CUDA: ``max_memory_allocated``, reset at each phase's start; CPU: the
    process's peak RSS, VmHWM reset through /proc/self/clear_refs, which counts the interpreter and libraries too),
    beside the plan's line for it (``planned_mib``, ``planned_line``: gpu_adapters.planned_phase_peaks) and, on
    CUDA, ``over_plan`` = measured / planned; ``over_step_start_mib``: the peak less what was in use when the step
    began (allocated, or RSS), what the phase added. The rollout phase ends when the engine's generation returns,
    the reference forward with ``_reference_logprobs`` (the rewards and row chunks before it), the training forward
    with the policy's forward (the advantages before it), the backward where ``optimizer_step`` starts (clipping
    and AdamW are the optimizer's).
``grpo_step_logprob_diff``
    The step's ``rollout/logprob_diff``: the mean over completion tokens of |sampler's log-prob - trainer's| on the
    same tokens and weights, in the compute dtype; ``max``: ``rollout/logprob_diff_max``.

    python bench/gpu/gpu_probe_grpo_step.py [--toy] [--budget-s N] [gpu_smoke.py's other options]
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # bench/gpu/ (these modules) and bench/ (_common.py)

import _common as C  # noqa: E402
import gpu_adapters as A  # noqa: E402
import torch  # noqa: E402
from gpu_probe import run_probe  # noqa: E402
from gpu_probe_grpo import DIFF, DIFF_MAX  # noqa: E402
from gpu_smoke import _round, now  # noqa: E402

PHASE_FIGURES = {"rollout": "mem_rollout_mib", "reference forward": "mem_ref_forward_mib",
                 "training forward": "mem_train_forward_mib", "training backward": "mem_train_backward_mib",
                 "optimizer": "mem_optimizer_mib"}
FIGURES = ("grpo_step_s", *PHASE_FIGURES.values(), "grpo_step_logprob_diff")
ROWS = {False: (16, 8), True: (4, 2)}  # (prompts per step, group size): on a GPU, at --toy
MIB = 2**20


def overrides(bench) -> list[str]:
    """The config of the step and of its plan: gpu_smoke's model shape, GRPO with a fixed reference, the rows above
    and gpu_smoke's prompt and completion lengths; evaluation batches of one row (the plan's rollout is the step's)."""
    s, cfg = bench.sizes, bench.model_cfg()
    prompts, group = ROWS[bench.args.toy]
    model = [f"model.{k}={getattr(cfg, k)}" for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden_dim",
                                                       "vocab_size", "max_seq_len") if getattr(cfg, k) is not None]
    out = ["algo=grpo", "reference=fixed", "model=qwen3_0.6b", *model, f"algo.prompts_per_step={prompts}",
           f"algo.group_size={group}", f"task.max_prompt_len={s.prompt_len}", f"task.max_new_tokens={s.new_tokens}",
           "eval.num_prompts=1", "eval.kl_prompts=1", f"training.device={bench.device.type}", "training.steps=2",
           "checkpoint=disabled", "logger=none"]
    if bench.args.mixed_precision != "auto":
        out.append(f"training.mixed_precision_param={bench.args.mixed_precision}")
    return out


class PhaseMeter:
    """Peak memory (bytes) and seconds of each phase, read at the phases' ends: ``mark(phase)`` closes the phase
    that began at the previous mark (or ``start()``) and starts the next. A phase marked twice keeps its largest
    peak and its summed seconds."""

    def __init__(self, device: torch.device):
        self.device = device
        self.measure = "cuda_max_memory_allocated" if device.type == "cuda" else "rss_hwm"
        self.peaks: dict[str, float] = {}
        self.seconds: dict[str, float] = {}
        self.start_bytes = 0.0  # what was in use when the step began: a phase's peak less it is what it added
        self.on = False

    def _reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        elif not C.reset_peak_rss():
            raise RuntimeError("not measurable: /proc/self/clear_refs is not writable (no peak-RSS reset)")
        self.t0 = now(self.device)

    def start(self) -> None:
        self.peaks.clear()
        self.seconds.clear()
        self.start_bytes = float(torch.cuda.memory_allocated(self.device) if self.device.type == "cuda"
                                 else C.rss_mb() * MIB)
        self.on = True
        self._reset()

    def mark(self, phase: str) -> None:
        if not self.on:
            return
        t = now(self.device)
        peak = (torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda"
                else C.peak_rss_mb() * MIB)
        self.peaks[phase] = max(self.peaks.get(phase, 0.0), float(peak))
        self.seconds[phase] = self.seconds.get(phase, 0.0) + t - self.t0
        self._reset()


@contextlib.contextmanager
def phase_marks(step_fn, meter: PhaseMeter):
    """Marks ``meter`` at the ends of ``step_fn``'s phases (see the module docstring) while inside."""
    from refexp.algos import grpo

    model = step_fn.policy.model
    generate, reference, step = step_fn.engine.generate, step_fn._reference_logprobs, grpo.optimizer_step

    def generate_marked(*args, **kwargs):
        out = generate(*args, **kwargs)
        meter.mark("rollout")
        return out

    def reference_marked(*args, **kwargs):
        out = reference(*args, **kwargs)
        meter.mark("reference forward")
        return out

    def step_marked(*args, **kwargs):
        meter.mark("training backward")
        out = step(*args, **kwargs)
        meter.mark("optimizer")
        return out

    def forward_done(module, args, output):
        if module.training and torch.is_grad_enabled():  # the update's forward, not a generation's sub-modules
            meter.mark("training forward")

    hook = model.register_forward_hook(forward_done)
    step_fn.engine.generate, step_fn._reference_logprobs, grpo.optimizer_step = (generate_marked, reference_marked,
                                                                                 step_marked)
    try:
        yield
    finally:
        hook.remove()
        grpo.optimizer_step = step
        del step_fn.engine.generate, step_fn._reference_logprobs  # the class's own again


def build_step(bench, cfg, work: Path):
    """refexp's GRPOStep over gpu_smoke's policy (random weights, built as a run builds it) and a fixed reference
    built from the same seed (the policy's initial weights), on random prompts of the task's prompt length."""
    import datasets

    from refexp.algos.grpo import GRPOStep
    from refexp.algos.loop import Policy
    from refexp.components.optim import build_optimizer
    from refexp.reference.strategies import build_reference
    from refexp.tasks import Task

    s = bench.sizes
    prompts = C.random_texts(cfg.algo.prompts_per_step * cfg.training.steps, s.prompt_len, s.vocab, seed=7,
                             eos_outside=True)
    train = datasets.Dataset.from_dict({"prompt": prompts, "completion": [""] * len(prompts),
                                        "answer": [""] * len(prompts)})
    task = Task(name="random", tokenizer=bench.tokenizer(), train=train, eval=train, max_new_tokens=s.new_tokens,
                reward=C.content_blind_reward, max_prompt_len=s.prompt_len)
    if bench.device.type == "cuda" and bench.args.mixed_precision == "float32":
        # gpu_check's fallback after the preflight's NCCL collective failed: the step's one-rank collectives on gloo
        from refexp.runtime import distributed as rdist

        rdist.init_distributed(bench.device, backend="gloo")
    ctx = C.make_context(cfg, task, work, bench.device)
    model = bench.build(trainable=True)
    t = cfg.training
    optimizers, schedulers = build_optimizer(model, optimizer=t.optimizer, lr=t.lr, beta1=t.beta1, beta2=t.beta2,
                                             eps=t.eps, weight_decay=t.weight_decay, warmup_steps=t.warmup_steps,
                                             total_steps=t.steps)
    strategy = build_reference(cfg.reference, lambda: bench.build(trainable=False))
    return GRPOStep(ctx, Policy(model, optimizers, schedulers), strategy)


def timed_step(step_fn, step: int) -> dict:
    """One step as ``refexp.algos.loop.run_loop`` runs it (the step, then the reference's update), its metrics
    with ``perf/step_s`` as the loop measures it (no evaluation here)."""
    from refexp.record.metric_names import PERF_STEP_S

    device = step_fn.ctx.device
    t0 = now(device)
    metrics = step_fn(step, None)
    step_fn.strategy.after_step(step, step_fn.policy.model, metrics)
    return {"step": step, **metrics, PERF_STEP_S: now(device) - t0}


def main(argv=None) -> dict:
    done: dict = {}

    def fig_step(bench) -> dict:
        cfg = A.plan_config(overrides(bench))
        done["planned"] = A.planned_phase_peaks(cfg)
        with tempfile.TemporaryDirectory(prefix="gpu_probe_grpo_step_") as work:
            step_fn = build_step(bench, cfg, Path(work))
            first = timed_step(step_fn, 1)
            meter = PhaseMeter(bench.device)
            with phase_marks(step_fn, meter):
                meter.start()
                metrics = timed_step(step_fn, 2)
        done.update(metrics=metrics, meter=meter)
        split = A.phase_split([metrics])
        shares = {f"{k[:-2]}_share": _round(split[k] / split["step_s"]) for k in ("gen_s", "ref_fwd_s", "policy_s")}
        a, sec = cfg.algo, meter.seconds
        return {"value": _round(split["step_s"]), "unit": "s", **shares,
                **{k: _round(split[k]) for k in ("gen_s", "ref_fwd_s", "policy_s")},
                "forward_s": _round(sec["training forward"]), "backward_s": _round(sec["training backward"]),
                "optimizer_s": _round(sec["optimizer"]), "first_step_s": _round(A.phase_split([first])["step_s"]),
                "prompts": a.prompts_per_step, "group_size": a.group_size, "prompt_len": cfg.task.max_prompt_len,
                "new_tokens": cfg.task.max_new_tokens, "share_prompt": a.share_prompt,
                "compute_dtype": bench.compute_dtype()}

    def fig_phase(phase: str) -> dict:
        if "meter" not in done:
            raise RuntimeError("needs grpo_step_s's step, which failed or was skipped")
        meter, (planned, line) = done["meter"], done["planned"][phase]
        measured = meter.peaks[phase]
        out = {"value": round(measured / MIB, 1), "unit": "MiB", "measure": meter.measure,
               "over_step_start_mib": round((measured - meter.start_bytes) / MIB, 1),
               "planned_mib": round(planned / MIB, 1), "planned_line": line, "seconds": _round(meter.seconds[phase])}
        if meter.measure == "cuda_max_memory_allocated":  # RSS also counts the interpreter and libraries
            out["over_plan"] = round(measured / planned, 3)
        return out

    def fig_diff(bench) -> dict:
        if "metrics" not in done:
            raise RuntimeError("needs grpo_step_s's step, which failed or was skipped")
        m = done["metrics"]
        return {"value": m[DIFF], "unit": "nats", "max": m[DIFF_MAX], "compute_dtype": bench.compute_dtype()}

    def figures(runner, bench):
        runner.run("grpo_step_s", lambda: fig_step(bench))
        for phase, name in PHASE_FIGURES.items():
            runner.run(name, lambda phase=phase: fig_phase(phase))
        runner.run("grpo_step_logprob_diff", lambda: fig_diff(bench))

    return run_probe(FIGURES, figures, argv)


if __name__ == "__main__":
    main()
