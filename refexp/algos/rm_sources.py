"""The reward-model stage's labelled samples and where they come from (``rm.temperatures``, ``rm.policies``).

A proxy trained on one model's samples at one temperature sees one narrow slice of what a policy under
optimisation writes, and GRPO finds the blind spots outside it at once (docs/overoptimization_grpo/: gold fell from
the first step). Gao et al. 2022 ("Scaling Laws for Reward Model Overoptimization", §2) train their proxies on
samples of many prompts; here the diversity comes from several *sources*, each a (model, temperature): the start
model and every policy of ``rm.policies`` (an HF export, e.g. a GRPO run's ``checkpoint/hf``), each at every
temperature of ``rm.temperatures``. Each source samples its own share of the prompts, every sample is labelled by
the task's verifier, and each source holds out its last ``rm.val_fraction`` of prompts, so the held-out split is by
prompt and has every source in it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from refexp.components.context import RunContext
from refexp.components.models import build_frozen
from refexp.components.rollout import build_engine
from refexp.config import ConfigError, RMStageConfig
from refexp.record.layout import RESOLVED_CONFIG
from refexp.record.resolved_config import read_resolved_config
from refexp.titan.checkpoint_dirs import is_hf_dir
from refexp.titan.families import Arch
from refexp.titan.hf_config import model_cfg_overrides_from_hf

RM_KEY = 9_191
"""The sampling-key namespace of the labelled samples (distinct from training rollouts and ``kl/init``'s)."""
START = "start"
"""``Source.model`` of the start (SFT) model."""


@dataclass(frozen=True)
class Source:
    """One source of labelled samples: ``model`` (``START`` or a policy's HF export dir) at ``temperature``."""

    model: str
    temperature: float


def policy_dir(path: str, field_name: str) -> Path:
    """The HF export ``path`` names: ``path`` itself when it holds ``config.json`` and safetensors weights, else the
    export a run dir holds (``<checkpoint.folder>/hf`` of its ``resolved_config.yaml``, written with
    ``checkpoint.last_save_in_hf=true``); ConfigError naming ``field_name`` otherwise."""
    p = Path(path).expanduser()
    if not p.is_dir():
        raise ConfigError(f"{field_name}={path!r} is not a directory: expected a policy's HF export (config.json + "
                          f"*.safetensors, e.g. a GRPO run's checkpoint/hf) or a run dir holding one")
    if is_hf_dir(p):
        return p.resolve()
    if (p / RESOLVED_CONFIG).is_file():
        folder = ((read_resolved_config(p) or {}).get("checkpoint") or {}).get("folder", "checkpoint")
        if is_hf_dir(p / folder / "hf"):
            return (p / folder / "hf").resolve()
        raise ConfigError(f"{field_name}={path!r} is a run dir without an HF export ({folder}/hf has no config.json "
                          f"and *.safetensors): rerun it with checkpoint.last_save_in_hf=true, or name an HF export")
    raise ConfigError(f"{field_name}={path!r} holds no config.json and *.safetensors: expected a policy's HF export "
                      f"(e.g. a GRPO run's checkpoint/hf) or a run dir holding one")


def policy_dirs(rm: RMStageConfig) -> list[Path]:
    """Each ``rm.policies`` entry's HF export (``policy_dir``), every one checked before any is used."""
    return [policy_dir(p, f"rm.policies[{i}]") for i, p in enumerate(rm.policies)]


SHAPE_FIELDS = ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden_dim")
"""The ``model.*`` shapes a policy's config.json must share with the run's model for its weights to load."""


def check_policy_shapes(rm: RMStageConfig, arch: Arch, name: str, vocab_known: bool) -> None:
    """ConfigError naming the first ``rm.policies`` entry whose HF export is not of the run's model (``name``,
    ``arch``: ``refexp.titan.spec.model_arch``), before the SFT stage and the sampling spend minutes reaching its
    weights; the vocabulary is compared where the run's is known before its tokenizer loads (``vocab_known``)."""
    fields = SHAPE_FIELDS + (("vocab_size",) if vocab_known else ())
    for i, (entry, export) in enumerate(zip(rm.policies, policy_dirs(rm))):
        try:
            found = model_cfg_overrides_from_hf(str(export))
        except (ConfigError, KeyError) as e:
            raise ConfigError(f"rm.policies[{i}]={entry!r}: {export}/config.json does not describe a model refexp "
                              f"builds ({e}): expected the HF export of a policy of this run's model") from None
        differ = ([f"model {found['name']} (this run: {name})"] if found["name"] != name else []) + [
            f"{f} {found[f]} (this run: {getattr(arch, f)})" for f in fields if found[f] != getattr(arch, f)]
        if differ:
            raise ConfigError(f"rm.policies[{i}]={entry!r}: its config.json is not this run's model: "
                              f"{', '.join(differ)}; expected a policy trained from this run's model.* settings")


def sources(rm: RMStageConfig) -> list[Source]:
    """The sources in their order: the start model at each temperature, then each policy at each."""
    models = [START, *(str(d) for d in policy_dirs(rm))]
    return [Source(m, float(t)) for m in models for t in rm.temperatures]


def well_formed(task_name: str, text: str, stopped: bool, demonstration: str) -> Optional[bool]:
    """Whether a completion has the task's answer format, None where the task has no cheap notion of one. The
    embedded arithmetic (``refexp/tasks/arithmetic.py``'s ``format_problem``): ASCII digits as many as the
    demonstration's zero-padded answer (``0359`` for ``042+317=``), then the stop token. A completion cut off by
    ``task.max_new_tokens``, with anything but digits, or of another width (the 5-digit sums a policy optimising a
    weak proxy wrote, docs/reward-models.md) is not."""
    if task_name != "arithmetic":
        return None
    return stopped and text.isascii() and text.isdigit() and len(text) == len(demonstration)


def labelled_samples(ctx: RunContext, sft_dir: Path) -> tuple[dict, dict, list[dict]]:
    """``(train, val, per_source)``. ``train``/``val``: ``{"prompts", "completions", "labels" [N] float tensor,
    "prompt_ids", "sources"}`` (a sample's training-row index and source index). ``rm.num_samples /
    samples_per_prompt`` training prompts are drawn (seeded by ``rm.seed``) and split into one equal block per
    source; each source samples ``samples_per_prompt`` completions of each of its prompts and holds out the last
    ``rm.val_fraction`` of them (at least one) with their samples. ``per_source``: one record per source (its model,
    temperature, samples, prompts, positive rate, format-invalid share or None)."""
    a, task = ctx.cfg.rm, ctx.task
    srcs = sources(a)
    n_prompts = min(len(task.train), max(2, a.num_samples // a.samples_per_prompt))
    per = n_prompts // len(srcs)
    if per < 2:
        raise ConfigError(f"rm.num_samples={a.num_samples}: the task's {len(task.train)} training prompts give "
                          f"{per} prompt(s) to each of the {len(srcs)} sources (rm.temperatures x the start model "
                          f"and rm.policies); each needs at least 2 (a training and a held-out prompt)")
    order = torch.randperm(len(task.train), generator=torch.Generator().manual_seed(a.seed))[:per * len(srcs)].tolist()
    n_val = min(per - 1, max(1, round(a.val_fraction * per)))
    train = {"prompts": [], "completions": [], "labels": [], "prompt_ids": [], "sources": []}
    val = {k: [] for k in train}
    per_source = []
    for si, src in enumerate(srcs):
        ids = order[si * per:(si + 1) * per]
        rows = task.train.select(ids)
        prompts = [p for p in rows["prompt"] for _ in range(a.samples_per_prompt)]
        answers = [x for x in rows["answer"] for _ in range(a.samples_per_prompt)]
        demos = [x for x in rows["completion"] for _ in range(a.samples_per_prompt)]
        pids = [pid for pid in ids for _ in range(a.samples_per_prompt)]
        keys = [(a.seed, RM_KEY, pid, g) for pid in ids for g in range(a.samples_per_prompt)]
        texts, stopped = _sample(ctx, sft_dir if src.model == START else Path(src.model), prompts, keys,
                                 src.temperature)
        labels = task.verify(texts, answers, prompts)
        bad = next((x for x in labels if not 0.0 <= x <= 1.0), None)
        if bad is not None:
            raise ConfigError(f"algo=rm trains on the verifier's labels in [0, 1] (binary cross-entropy), and the "
                              f"task's reward gave {bad}: use a task whose reward is a correctness score (task.reward)")
        formed = [well_formed(ctx.cfg.task.name, t, s, d) for t, s, d in zip(texts, stopped, demos)]
        per_source.append({
            "model": src.model, "temperature": src.temperature, "samples": len(texts), "prompts": per,
            "positive_rate": sum(labels) / len(labels),
            "format_invalid": None if formed[0] is None else sum(not f for f in formed) / len(formed)})
        cut = (per - n_val) * a.samples_per_prompt
        for part, sl in ((train, slice(0, cut)), (val, slice(cut, None))):
            for k, v in (("prompts", prompts), ("completions", texts), ("labels", labels), ("prompt_ids", pids),
                         ("sources", [si] * len(texts))):
                part[k] += v[sl]
    for part in (train, val):
        part["labels"] = torch.tensor(part["labels"])
    return train, val, per_source


def _sample(ctx: RunContext, model_dir: Path, prompts: list[str], keys: list[tuple[int, ...]], temperature: float
            ) -> tuple[list[str], list[bool]]:
    """(texts, whether each ended with a stop token) of one completion per prompt from the model in ``model_dir``
    (an SFT output or an HF export), freed before returning."""
    task = ctx.task
    model = build_frozen(ctx, model_dir)
    engine = build_engine(ctx.cfg.rollout, model, task.tokenizer)
    texts: list[str] = []
    stopped: list[bool] = []
    for s in range(0, len(prompts), 256):
        out = engine.generate(prompts[s:s + 256], max_new_tokens=task.max_new_tokens, temperature=temperature,
                              keys=keys[s:s + 256])
        texts += out.texts
        stopped += [bool(ids) and ids[-1] in task.tokenizer.stop_ids for ids in out.completion_ids]
    del model, engine
    return texts, stopped
