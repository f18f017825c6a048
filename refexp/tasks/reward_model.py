"""A learned reward: an HF ``AutoModelForSequenceClassification`` checkpoint (``num_labels=1``) with its own
tokenizer, loaded through transformers, scoring prompt + completion text (``task.reward_model``,
``task.gold_reward_model``, a dir among ``task.reward_funcs``; docs/reward-models.md).

As TRL's ``GRPOTrainer`` scores with a reward model (its ``_calculate_rewards``): the reward is the model's
single logit; a tokenizer with a chat template renders ``[user: prompt, assistant: completion]``, one without
reads ``prompt + completion``. Two departures, both so that the reward model reads what its backbone was
trained on: a prompt already rendered by the policy's template (``task.chat_template=true``) is read as it is,
not templated twice; and the tokenizer's BOS leads every text when it has one (refexp's policies always see it;
TRL tokenizes with ``add_special_tokens=False``). ``reward_model_inputs`` is that encoding, shared with the
training of ``refexp algo=rm`` (refexp/algos/rm.py), so a model scores what it was trained on.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import torch

from refexp.config import ConfigError
from refexp.record.cache_dirs import manifest_path, verified_entry
from refexp.tasks.reward_model_weights import quiet_transformers, weights_problem

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
HOST = torch.device("cpu")


STAGE_MODEL = "rm"
"""The value of a reward-model field that names the reward-model stage's model (the root ``rm`` block;
refexp/algos/rm.py), trained or found in the cache at the run's start."""


def is_reward_model_entry(entry: str) -> bool:
    """A ``task.reward_funcs`` entry is a reward model when it is ``rm`` or a path (it holds ``/``, or is a dir);
    else ``verifier`` or a function's dotted path."""
    return entry == STAGE_MODEL or "/" in entry or os.sep in entry or os.path.isdir(entry)


def check_reward_model_dir(field_name: str, path: str) -> None:
    """ConfigError naming ``field_name`` unless ``path`` is a sequence-classification checkpoint with one label,
    a tokenizer and its head's weights: reads config.json and the weight files' names only, before any model is
    built (``tasks/reward_model_weights.py``)."""
    expected = ("an HF AutoModelForSequenceClassification checkpoint dir with num_labels=1 and its tokenizer "
                "(e.g. the hf/ dir `refexp algo=rm` prints)")
    if not os.path.isdir(path):
        raise ConfigError(f"{field_name}={path!r} is not a directory: expected {expected}")
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise ConfigError(f"{field_name}={path!r} has no config.json: expected {expected}")
    try:
        with open(config_file) as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{field_name}={path!r}: config.json is not readable JSON ({e}): expected {expected}") from e
    architectures = config.get("architectures") or []
    if not any(str(a).endswith("ForSequenceClassification") for a in architectures):
        raise ConfigError(f"{field_name}={path!r} is not a sequence-classification checkpoint (config.json's "
                          f"architectures are {architectures}): expected {expected}")
    num_labels = config.get("num_labels", len(config.get("id2label") or {}) or 2)  # transformers' default is 2
    if num_labels != 1:
        raise ConfigError(f"{field_name}={path!r} has num_labels={num_labels}: expected 1 (a scalar reward)")
    if not any(os.path.isfile(os.path.join(path, f)) for f in _TOKENIZER_FILES):
        raise ConfigError(f"{field_name}={path!r} has no tokenizer (tokenizer.json / tokenizer_config.json): "
                          f"expected {expected}")
    problem = weights_problem(path)
    if problem:
        raise ConfigError(f"{field_name}={path!r} has {problem}: expected {expected}")


def reward_model_texts(tokenizer, prompts: list[str], completions: list[str], *, prompts_rendered: bool) -> list[str]:
    """The text a reward model reads for each (prompt, completion): its chat template over the user and assistant
    turns when it has one and the prompts are plain, else prompt + completion (see the module docstring)."""
    if getattr(tokenizer, "chat_template", None) and not prompts_rendered:
        return [tokenizer.apply_chat_template([{"role": "user", "content": p}, {"role": "assistant", "content": c}],
                                              tokenize=False) for p, c in zip(prompts, completions)]
    return [p + c for p, c in zip(prompts, completions)]


def reward_model_inputs(tokenizer, texts: list[str], device) -> dict[str, torch.Tensor]:
    """``input_ids`` / ``attention_mask`` [B, T], right-padded with the tokenizer's pad id, BOS first when the
    tokenizer has one and the text does not already start with it."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    bos = tokenizer.bos_token_id
    rows = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        rows.append([bos] + ids if bos is not None and (not ids or ids[0] != bos) else ids)
    width = max(1, max(len(r) for r in rows))
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        input_ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, :len(r)] = 1
    return {"input_ids": input_ids.to(device), "attention_mask": mask.to(device)}


def load_sequence_classifier(path: str, dtype: torch.dtype = torch.float32, device="cpu", num_labels: int = 1):
    """``(model, tokenizer)`` of an HF checkpoint dir as a sequence classifier (a causal LM's dir gets a fresh
    ``score`` head: how ``refexp algo=rm`` starts), the model's ``pad_token_id`` set from the tokenizer (its
    forward finds each row's last token by it)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    with quiet_transformers():  # "newly initialized: score.weight" is expected for a fresh head
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=num_labels, dtype=dtype,
                                                                   local_files_only=True)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    model.config.pad_token_id = pad
    return model.to(device), tokenizer


def verify_if_cached(path: str) -> None:
    """A reward model in refexp's cache (``<cache>/rm/<key>/hf``, the dir `refexp algo=rm` prints) is checked
    against its entry's manifest before it is read (``record.cache_dirs.verified_entry``); another dir with a
    manifest of its own too."""
    for d in (Path(path), Path(path).parent):
        if manifest_path(d).is_file() or (d / "rm.json").is_file():
            verified_entry(d, "reward model")
            return


class RewardModel:
    """``reward_model(prompts, completions) -> list[float]``: a sequence classifier's logit of each text, scored
    in batches of ``batch_size`` under ``torch.inference_mode`` on ``device`` (with ``offload``: kept in host
    memory and moved to ``device`` for each call)."""

    def __init__(self, path: str, *, field_name: str, device="cpu", dtype: str = "float32", batch_size: int = 64,
                 offload: bool = False, prompts_rendered: bool = False):
        self.path, self.field_name, self.batch_size = path, field_name, batch_size
        self.device, self.offload, self.prompts_rendered = torch.device(device), offload, prompts_rendered
        verify_if_cached(path)
        self.model, self.tokenizer = load_sequence_classifier(path, DTYPES[dtype], HOST if offload else self.device)
        self.model.eval().requires_grad_(False)

    @property
    def name(self) -> str:
        return f"{self.field_name}={self.path}"

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @contextmanager
    def _resident(self):
        if not self.offload or self.device == HOST:
            yield
            return
        self.model.to(self.device)
        try:
            yield
        finally:
            self.model.to(HOST)

    @torch.inference_mode()
    def __call__(self, prompts: list[str], completions: list[str]) -> list[float]:
        texts = reward_model_texts(self.tokenizer, prompts, completions, prompts_rendered=self.prompts_rendered)
        out: list[float] = []
        with self._resident():
            for s in range(0, len(texts), self.batch_size):
                inputs = reward_model_inputs(self.tokenizer, texts[s:s + self.batch_size], self.device)
                out += self.model(**inputs).logits[:, 0].float().tolist()
        return out


def reward_model_parameters(path: Optional[str]) -> Optional[int]:
    """Parameters of the checkpoint at ``path`` from its config.json alone (a meta-device build; for a memory plan),
    None when the dir is not on this machine."""
    if not path or not os.path.isfile(os.path.join(path, "config.json")):
        return None
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(path, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForSequenceClassification.from_config(config)
    return sum(p.numel() for p in model.parameters())


def reward_models_plan_line(task_cfg, stage_model_params: int) -> tuple[str, float, str] | None:
    """The dry-run plan's line for the reward models of ``task_cfg`` (weights on the trainer's device, in
    ``task.reward_model_dtype``; 0 with ``task.reward_model_offload``), None when none is configured. ``rm`` (the
    stage's model) counts ``stage_model_params`` (the policy's shape); a dir that is not on this machine counts 0
    and says so."""
    paths = [p for p in (task_cfg.reward_model, task_cfg.gold_reward_model) if p]
    paths += [e for e in task_cfg.reward_funcs if is_reward_model_entry(e)]
    paths = list(dict.fromkeys(paths))
    if not paths:
        return None
    counts = [stage_model_params if p == STAGE_MODEL else reward_model_parameters(p) for p in paths]
    if any(n is None for n in counts):
        return "reward models", 0.0, "not counted: a reward model dir is not on this machine"
    n = sum(counts)
    if task_cfg.reward_model_offload:
        return "reward models", 0.0, f"{n / 1e9:.3f}B parameters in host memory (task.reward_model_offload)"
    size = torch.finfo(DTYPES[task_cfg.reward_model_dtype]).bits // 8
    return "reward models", float(n * size), f"{len(paths)} model(s), {n / 1e9:.3f}B x {size} B, every rank"
