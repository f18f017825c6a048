"""``refexp dry_run=true ...``: the per-rank memory plan of a configured run, printed before any real work.

The models are built on the meta device (shapes only: no checkpoint, no data, no accelerator), so the plan
of an 8-GPU 8B run prints in seconds on a laptop. Data paths, which only a real run reads, may stay unset.
A ``model.pretrained`` checkpoint's shapes are its converted config.json's, so a dry run fetches and converts it
on first use, as the run would (refexp/components/pretrained.py).
What is counted in each phase (rollout, policy training, reference forward, drift measurement) and why: docs/gpus.md,
"What the plan counts" (the code: refexp/cli/memory_plan.py).
"""

from __future__ import annotations

import copy

from omegaconf import DictConfig, OmegaConf

from refexp.cli.memory_plan import GIB, MemoryPlan, layout, plan, static_decode_warning
from refexp.config.task import ignored_fields

UNSET = "<unset in a dry run>"
PEAK = "per-rank peak estimate"


def fill_data_paths(cfg: DictConfig) -> DictConfig:
    """A copy of ``cfg`` whose unset ``task.*_path`` values hold a placeholder: a plan reads no data, so
    the task's "where is the data" checks must not stop it (``model.hf_assets_path`` stays as given:
    unset, the preset's flavor gives the shapes, or ``model.pretrained``'s converted checkpoint, ``dry_run``)."""
    out = copy.deepcopy(cfg)
    ignored = ignored_fields(out.task.name, out.task.get("preference_path"))  # must stay unset
    for key in list(out.task.keys()):
        if key in ignored:
            continue
        if str(key).endswith("_path") and (OmegaConf.is_missing(out.task, key) or out.task[key] is None):
            out.task[key] = UNSET
    return out


def _row(what: str, b: float, how: str) -> str:
    return f"  {what:<36} {b / GIB:>9.2f} GiB   {how}"


def format_plan(cfg, p: MemoryPlan) -> str:
    world, rep, shard, tp = layout(cfg)
    where = f"{world} ranks: {rep} replicate x {shard} shard x {tp} TP" if world > 1 else "1 process"
    # model.pretrained's shapes are its converted config.json's: its flavor (debugmodel) only names the family
    model = cfg.model.pretrained or cfg.model.flavor
    lora = f", LoRA rank {cfg.model.lora.rank}" if cfg.model.lora.enabled else ""
    out = [f"refexp dry run: {cfg.algo.name} x reference={cfg.reference.name}, model {cfg.model.name} "
           f"{model}{lora}, {where}, device {p.device}, compute {p.compute}",
           "held in every phase:", *(_row(i.what, i.bytes, i.how) for i in p.resident)]
    for name, items in p.phases.items():
        out += [f"{name}, on top:", *(_row(i.what, i.bytes, i.how) for i in items)]
    out.append("phase peaks:")
    out += [_row(f"{name} peak", p.phase_peak(name), "<- the peak" if name == p.peak_phase else "")
            for name in p.phases]
    out.append(_row(p.checkpoint.what, p.checkpoint.bytes, p.checkpoint.how))
    out.append(f"{PEAK}: {p.peak / GIB:.2f} GiB")
    warning = static_decode_warning(p)
    if warning:
        out.append(warning)
    return "\n".join(line.rstrip() for line in out)


def plan_lines(cfg) -> list[tuple[str, float, str]]:
    """``(what, bytes, how)`` of every line ``format_plan`` prints, phase peaks and the peak last, for a
    validated RootConfig (bench/gpu/gpu_adapters.py reads them)."""
    p = plan(cfg)
    out = [(i.what, i.bytes, i.how) for i in p.resident]
    for name, items in p.phases.items():
        out += [(i.what, i.bytes, i.how) for i in items]
    out += [(f"{name} peak", p.phase_peak(name), "") for name in p.phases]
    out += [(p.checkpoint.what, p.checkpoint.bytes, p.checkpoint.how), (PEAK, p.peak, p.peak_phase)]
    return out


def dry_run(dcfg: DictConfig) -> dict:
    """Validate what a plan needs (data paths may stay unset), print the plan, return ``{line: bytes}``."""
    from refexp.components.pretrained import resolve_pretrained
    from refexp.config import to_object

    to_object(fill_data_paths(dcfg))  # the config's own checks before anything is fetched
    # model.pretrained's shapes are its converted config.json's: fetched and converted on first use, as a run would
    resolve_pretrained(dcfg)
    cfg = to_object(fill_data_paths(dcfg))
    print(format_plan(cfg, plan(cfg)))
    return {what: b for what, b, _ in plan_lines(cfg)}
