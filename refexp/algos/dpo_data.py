"""Preference pairs for DPO: on-policy pairs sampled from the SFT model for the embedded task (stored once in the
cache dir), or a file's (``task.preference_path``); ``pack_pairs`` lays a batch out for one forward as
``[chosen rows; rejected rows]``. How the pairs are made and keyed: docs/algorithms.md, "The preference pairs".
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import datasets
import torch

from refexp.algos.start_key import start_in_key
from refexp.components.context import RunContext
from refexp.components.models import build_frozen
from refexp.components.rollout import BuiltinEngine, RolloutEngine, build_engine, decode_capacity
from refexp.config.diff import in_cache_terms
from refexp.config.model import model_identity
from refexp.record.atomic import atomic_dir
from refexp.record.cache_dirs import marker_check, verified_entry, write_entry_manifest
from refexp.record.hashing import digest, stable_hash
from refexp.reference.refcache import checkpoint_stamp
from refexp.runtime import distributed as rdist
from refexp.tasks import task_fingerprint
from refexp.tasks.batching import pack_sequences
from refexp.tasks.data_checks import DPO_CHOSEN, check_targets

PAIRS_FORMAT = 1
"""Bump when the way pairs are made changes, so stored sets of the old way are not reused."""
TRIES = 4
"""Samples per prompt searched for an incorrect completion."""
PROMPTS_PER_BATCH = 128
"""Prompts per sampling batch (fixed: part of what makes the set deterministic)."""


# ---------------------------------------------------------------- where the pairs come from
def load_pairs(ctx: RunContext, sft_dir: Path) -> datasets.Dataset:
    """The run's preference pairs: columns ``prompt``, ``chosen``, ``rejected`` (text; completions
    continue the prompt, no EOS). The file of ``task.preference_path`` when set, else the embedded
    task's pairs of the SFT model at ``sft_dir`` (generated now if not stored yet)."""
    if ctx.task.preference is not None:
        return ctx.task.preference
    check_targets(ctx.cfg.task, ctx.task.train, [DPO_CHOSEN])  # also checked before any model is fetched
    a = ctx.cfg.algo
    out = rdist.decided_by_rank0(lambda: pairs_dir(ctx.cache_dir, pairs_key(ctx, sft_dir)))  # file times: rank 0's
    # All ranks agree on rank 0's view: every rank must join the sharded forwards of generation.
    if rdist.broadcast_object(_pairs_saved(out)):
        rdist.decided_by_rank0(lambda: verified_entry(out, "DPO pairs"))  # before any rank reads it
    else:
        model = build_frozen(ctx, sft_dir)
        rows = sample_pairs(model, ctx.task, num_pairs=a.num_pairs, pair_seed=a.pair_seed,
                            max_new_tokens=ctx.task.max_new_tokens,
                            engine=build_engine(ctx.cfg.rollout, model, ctx.task.tokenizer,
                                                capacity=decode_capacity(ctx.cfg)))
        del model
        if ctx.dist.is_rank0:
            _save_atomic(datasets.Dataset.from_dict(rows), out,
                         {"num_pairs": a.num_pairs, "pair_seed": a.pair_seed,
                          "max_new_tokens": ctx.task.max_new_tokens, "tries": TRIES, "format": PAIRS_FORMAT,
                          "made": len(rows["prompt"])})
        rdist.barrier()
    pairs = datasets.load_from_disk(str(out))
    if len(pairs) == 0:
        raise RuntimeError(f"the SFT model at {sft_dir} answered every train prompt correctly in all {TRIES} "
                           f"samples: no preference pairs (use task.preference_path, or a weaker SFT model)")
    if len(pairs) < a.num_pairs and ctx.dist.is_rank0:
        warnings.warn(f"[refexp] only {len(pairs)} of algo.num_pairs={a.num_pairs} pairs: the SFT model erred on "
                      f"no more of the {len(ctx.task.train)} train prompts of the RL skills", stacklevel=2)
    return pairs


def pairs_key(ctx: RunContext, sft_dir: Path) -> dict:
    """What the pairs sampled from the model at ``sft_dir`` are a function of (see the module doc); paths into the
    cache by their place in it (``in_cache_terms``, ``start_in_key``), so a copied or moved cache keeps the key."""
    cfg, a = ctx.cfg, ctx.cfg.algo
    return {"task": task_fingerprint(cfg.task, cfg.sft.cache_dir),
            "start": {"path": start_in_key(cfg, sft_dir), "stamp": checkpoint_stamp(sft_dir)},
            "model": in_cache_terms(model_identity(cfg.model), cfg.sft.cache_dir), "dtype": cfg.training.dtype,
            "num_pairs": a.num_pairs, "pair_seed": a.pair_seed, "max_new_tokens": ctx.task.max_new_tokens}


def pairs_dir(cache_dir: Path, key: dict) -> Path:
    """``<cache_dir>/pairs/<hash of key, TRIES and PAIRS_FORMAT>``."""
    return Path(cache_dir) / "pairs" / stable_hash({**key, "tries": TRIES, "format": PAIRS_FORMAT}, 16)


@torch.no_grad()
def sample_pairs(model: torch.nn.Module, task, *, num_pairs: int, pair_seed: int, max_new_tokens: int,
                 tries: int = TRIES, engine: RolloutEngine | None = None) -> dict[str, list]:
    """Columns ``prompt_id`` (train row), ``prompt``, ``chosen`` (the demonstration), ``rejected`` (the
    model's first incorrect sample of ``tries``, keys ``(pair_seed, prompt_id, k)``).

    Deterministic for a seed: the keys fix every uniform, the batches are fixed (``PROMPTS_PER_BATCH``
    train rows in order), and the stop decision is rank 0's.
    """
    rows: dict[str, list] = {"prompt_id": [], "prompt": [], "chosen": [], "rejected": []}
    engine = engine or BuiltinEngine(model, task.tokenizer)
    was_training = model.training
    model.eval()
    n = len(task.train)
    for start in range(0, n, PROMPTS_PER_BATCH):
        if rdist.broadcast_object(len(rows["prompt"]) >= num_pairs):
            break
        ids = list(range(start, min(n, start + PROMPTS_PER_BATCH)))
        batch = task.train.select(ids)
        prompts = [p for p in batch["prompt"] for _ in range(tries)]
        r = engine.generate(prompts, max_new_tokens=max_new_tokens,
                            keys=[(pair_seed, pid, k) for pid in ids for k in range(tries)],
                            max_prompt_len=task.max_prompt_len)
        for j, pid in enumerate(ids):
            samples = r.texts[j * tries:(j + 1) * tries]
            wrong = next((t for t in samples if task.reward(t, batch["answer"][j]) < 1.0), None)
            if wrong is None or len(rows["prompt"]) >= num_pairs:
                continue
            rows["prompt_id"].append(pid)
            rows["prompt"].append(batch["prompt"][j])
            # the correct completion: a demonstration may carry task.demo_slip's error
            rows["chosen"].append(batch["solution" if "solution" in batch.column_names else "completion"][j])
            rows["rejected"].append(wrong)
    model.train(was_training)
    return rows


_pairs_saved = marker_check("pairs.json")
"""Whether a pairs dir is complete (``pairs.json`` is written last)."""


def _save_atomic(ds: datasets.Dataset, out: Path, meta: dict) -> None:
    """Write into a private temp dir, then rename it into place (a lost race keeps the winner's)."""
    with atomic_dir(out, is_complete=_pairs_saved) as tmp:
        ds.save_to_disk(str(tmp))
        (tmp / "pairs.json").write_text(json.dumps(meta, indent=2))  # marks the set complete
        write_entry_manifest(tmp)  # last, before the rename publishes the entry


# ---------------------------------------------------------------- pairs -> tensors
@dataclass
class PairBatch:
    """B pairs packed for one forward (Rafailov et al. 2023's concatenated chosen+rejected pass).

    tokens_BT:  [2B, T] rows ``[bos] prompt completion eos`` right-padded; rows 0..B-1 are the chosen
                completions, rows B..2B-1 the rejected ones of the same pairs.
    mask_BT:    [2B, T-1] bool, aligned with ``titan.token_logprobs``: True where ``tokens[:, t+1]``
                is a completion token (EOS included).
    lengths_B:  [2B] completion token counts (> 0).
    """

    tokens_BT: torch.Tensor
    mask_BT: torch.Tensor
    lengths_B: torch.Tensor

    @property
    def num_pairs(self) -> int:
        return self.tokens_BT.shape[0] // 2

    def to(self, device: torch.device) -> "PairBatch":
        return PairBatch(self.tokens_BT.to(device), self.mask_BT.to(device), self.lengths_B.to(device))


def pack_pairs(tokenizer, rows: datasets.Dataset | dict) -> PairBatch:
    """Pack pairs (``prompt``/``chosen``/``rejected`` columns) as ``[chosen rows; rejected rows]``."""
    prompts = list(rows["prompt"])
    tokens, completion = pack_sequences(tokenizer, prompts + prompts, list(rows["chosen"]) + list(rows["rejected"]),
                                        add_eos=True)
    mask = completion[:, 1:]  # completion token t+1 is predicted at log-prob column t
    return PairBatch(tokens, mask, mask.sum(-1))


def pairs_fingerprint(pairs: datasets.Dataset, tokenizer) -> str:
    """Hash of the pairs' text and the tokenizer: equal fingerprints give equal token rows."""
    def chunks():
        yield tokenizer.backend.to_str().encode()
        yield json.dumps([tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id]).encode()
        for column in ("prompt", "chosen", "rejected"):
            for text in pairs[column]:
                yield text.encode()
                yield b"\x00"
            yield b"\x01"

    return digest(chunks(), 16)
