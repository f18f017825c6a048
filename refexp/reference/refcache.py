"""Reference log-probs of preference pairs: computed once for a fixed reference, memoised per
version for a moving one.

DPO's reference term ``log pi_ref(y|x)`` (Rafailov et al. 2023, eq. 7) does not depend on the
policy. With a fixed reference it is a constant of the data set, so it is computed in one batched
``inference_mode`` pass before training and stored on disk (TRL's ``precompute_ref_log_probs``),
keyed by the reference's identity and the data's fingerprint, so every run of a sweep that shares
them reads it instead of recomputing; the reference model is then not kept in memory at all.

With a moving reference (periodic reset / EMA / KL-triggered, TR-DPO, Gorbatovski et al. 2024) the
values are constant only between two reference updates. ``VersionedRefLogps`` memoises them by
pair id for the current ``strategy.version``, computes only the rows a batch misses, and drops
everything when the version changes. (TRL refuses ``precompute_ref_log_probs`` together with
``sync_ref_model``; here the two compose.)

Every source answers ``lookup(pair_ids) -> (RefLogps, hits, misses)``.

Files: ``<cache>/refcache/<key>.pt``, a ``torch.save`` of plain tensors (loaded with
``weights_only=True``), written to a private temporary name and renamed into place: two processes
computing the same key at once both write complete, identical files and the last rename wins.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from refexp.record.atomic import torch_save_atomic
from refexp.record.cache_dirs import verified_entry, write_entry_manifest
from refexp.record.hashing import stable_hash
from refexp.runtime import distributed as rdist
from refexp.titan import latest_checkpoint_step

CACHE_FORMAT = 1
"""Bump when what is stored changes, so files of the old layout are not read."""


@dataclass
class RefLogps:
    """Reference log-probs of n pairs, in the order they were asked for.

    chosen_N, rejected_N: [n] float32 sums over each completion's tokens (EOS included).
    chosen_tok:           [sum of chosen lengths] float32 per-token log-probs of the chosen
                          completions, row i at ``offsets[i]:offsets[i+1]`` (for ``kl/ref``).
    offsets:              [n+1] int64.
    """

    chosen_N: torch.Tensor
    rejected_N: torch.Tensor
    chosen_tok: torch.Tensor
    offsets: torch.Tensor

    def __len__(self) -> int:
        return self.chosen_N.shape[0]

    @classmethod
    def from_logprobs(cls, logp_BT: torch.Tensor, mask_BT: torch.Tensor) -> "RefLogps":
        """From token log-probs [2B, T-1] of a ``dpo_data.PairBatch`` (rows ``[chosen; rejected]``)."""
        B = logp_BT.shape[0] // 2
        logp = torch.where(mask_BT, logp_BT.float(), torch.zeros((), device=logp_BT.device))
        seq = logp.sum(-1)
        lengths = mask_BT[:B].sum(-1).cpu()
        offsets = torch.zeros(B + 1, dtype=torch.long)
        offsets[1:] = lengths.cumsum(0)
        # mask_BT[:B] in row-major order visits each chosen row's completion tokens in order
        return cls(seq[:B].detach(), seq[B:].detach(), logp_BT[:B][mask_BT[:B]].float().detach(), offsets)

    def select(self, idx: Sequence[int]) -> "RefLogps":
        """Rows ``idx`` (any order, repeats allowed)."""
        idx = list(idx)
        lengths = (self.offsets[1:] - self.offsets[:-1])[idx]
        offsets = torch.zeros(len(idx) + 1, dtype=torch.long)
        offsets[1:] = lengths.cumsum(0)
        tok = [self.chosen_tok[self.offsets[i]:self.offsets[i + 1]] for i in idx]
        return RefLogps(self.chosen_N[idx], self.rejected_N[idx],
                        torch.cat(tok) if tok else self.chosen_tok[:0], offsets)

    @classmethod
    def cat(cls, parts: Sequence["RefLogps"]) -> "RefLogps":
        offsets = [torch.zeros(1, dtype=torch.long)]
        end = 0
        for p in parts:
            offsets.append(p.offsets[1:] + end)
            end += int(p.offsets[-1])
        return cls(torch.cat([p.chosen_N for p in parts]), torch.cat([p.rejected_N for p in parts]),
                   torch.cat([p.chosen_tok for p in parts]), torch.cat(offsets))

    def chosen_tok_BT(self, chosen_mask_BT: torch.Tensor) -> torch.Tensor:
        """The chosen per-token log-probs laid out on a [B, T-1] completion mask (0 elsewhere)."""
        out = torch.zeros(chosen_mask_BT.shape, dtype=torch.float32, device=chosen_mask_BT.device)
        out[chosen_mask_BT] = self.chosen_tok.to(chosen_mask_BT.device)
        return out

    def to(self, device: torch.device) -> "RefLogps":
        return RefLogps(self.chosen_N.to(device), self.rejected_N.to(device), self.chosen_tok.to(device),
                        self.offsets)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"chosen": self.chosen_N.cpu(), "rejected": self.rejected_N.cpu(), "chosen_tok": self.chosen_tok.cpu(),
                "offsets": self.offsets.cpu()}


def compute_table(compute: Callable[[list[int]], RefLogps], n: int, batch_size: int, *, rank: int = 0,
                  degree: int = 1, dp_sum: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
                  device: torch.device | str = "cpu") -> RefLogps:
    """All n rows of ``compute`` (on CPU), in batches of ``batch_size`` pairs.

    Each of ``degree`` data-parallel ranks computes one contiguous block with the same number of
    ``compute`` calls (a rank that runs out joins with a discarded call: the forwards are collective
    under FSDP/TP); the blocks are then gathered by ``dp_sum`` of zero-filled full tables on ``device``
    (the process group's: CUDA for NCCL).
    """
    per = -(-n // degree)
    lo, hi = min(n, rank * per), min(n, (rank + 1) * per)
    parts = []
    for b in range(-(-per // batch_size)):
        ids = list(range(lo + b * batch_size, min(hi, lo + (b + 1) * batch_size)))
        rows = compute(ids or [0])
        if ids:
            parts.append(rows)
    mine = RefLogps.cat(parts) if parts else None
    if degree == 1:
        return mine.to(torch.device("cpu"))
    dev = torch.device(device)
    lengths = torch.zeros(n, dtype=torch.long, device=dev)
    chosen, rejected = torch.zeros(n, device=dev), torch.zeros(n, device=dev)
    if mine is not None:
        lengths[lo:hi] = (mine.offsets[1:] - mine.offsets[:-1]).to(dev)
        chosen[lo:hi], rejected[lo:hi] = mine.chosen_N.to(dev), mine.rejected_N.to(dev)
    lengths = dp_sum(lengths).cpu()
    offsets = torch.zeros(n + 1, dtype=torch.long)
    offsets[1:] = lengths.cumsum(0)
    chosen_tok = torch.zeros(int(offsets[-1]), device=dev)
    if mine is not None:
        chosen_tok[int(offsets[lo]):int(offsets[hi])] = mine.chosen_tok.to(dev)
    return RefLogps(dp_sum(chosen).cpu(), dp_sum(rejected).cpu(), dp_sum(chosen_tok).cpu(), offsets)


# ---------------------------------------------------------------- identity and the file
def checkpoint_stamp(checkpoint: str | os.PathLike) -> list[dict]:
    """What changes when the weights at ``checkpoint`` change: the mtime and size of the SFT dir's
    ``sft.json`` (written last), else of the DCP ``.metadata`` the loader would read, else of an HF
    dir's ``*.safetensors``."""
    p = Path(checkpoint)
    step = latest_checkpoint_step(p / "checkpoint")
    for f in (p / "sft.json", p / "model" / ".metadata", p / ".metadata",
              p / "checkpoint" / f"step-{step}" / ".metadata"):
        if f.is_file():
            return [_file_stamp(f, p)]
    if weights := sorted(p.glob("*.safetensors")):
        return [_file_stamp(f, p) for f in weights]
    raise FileNotFoundError(f"{str(p)!r} holds no SFT output, DCP checkpoint or HF safetensors to key a "
                            f"reference cache on")


def _file_stamp(f: Path, root: Path) -> dict:
    st = f.stat()
    return {"file": str(f.relative_to(root)), "mtime_ns": st.st_mtime_ns, "size": st.st_size}


def cache_key(checkpoint: str | os.PathLike, dtype: str, data_fingerprint: str, model: dict | None = None, *,
              path: str | None = None) -> str:
    """Hash of the reference's identity (``path``, by default ``checkpoint`` resolved, + stamp + dtype + the model
    config it is loaded into) and the pairs' fingerprint."""
    key = {"path": path or str(Path(checkpoint).resolve()), "stamp": checkpoint_stamp(checkpoint), "dtype": dtype,
           "model": model, "data": data_fingerprint, "format": CACHE_FORMAT}
    return stable_hash(key, 20)


def cache_file(cache_dir: str | os.PathLike, key: str) -> Path:
    return Path(cache_dir) / "refcache" / f"{key}.pt"


def save(table: RefLogps, path: Path) -> None:
    """Write atomically: a private temp name, then ``os.replace`` (``refexp/record/atomic.py``); then its
    manifest beside it (``refexp/record/cache_dirs.py``)."""
    torch_save_atomic(table.tensors(), path)
    write_entry_manifest(path)


def load(path: Path) -> RefLogps:
    sd = torch.load(path, map_location="cpu", weights_only=True)
    return RefLogps(sd["chosen"], sd["rejected"], sd["chosen_tok"], sd["offsets"])


def load_or_compute(path: Path, compute_all: Callable[[], RefLogps], *, num_rows: int) -> tuple[RefLogps, bool]:
    """The table at ``path``, or ``compute_all()`` (collective: every rank calls it) written there by
    rank 0. Returns ``(table, computed)``; all ranks follow rank 0's view of whether the file exists."""
    if rdist.broadcast_object(path.is_file()):
        rdist.decided_by_rank0(lambda: verified_entry(path, "reference log-probs"))
        table = load(path)
        if len(table) != num_rows:
            raise RuntimeError(f"reference cache {path} has {len(table)} rows, expected {num_rows}; "
                               f"delete it to recompute")
        return table, False
    table = compute_all()
    if rdist.is_rank0():
        save(table, path)
    return table, True


# ---------------------------------------------------------------- sources: lookup(ids) -> (RefLogps, hits, misses)
class PrecomputedRefLogps:
    """Every pair's reference log-probs in memory (a fixed reference): all lookups are hits."""

    def __init__(self, table: RefLogps):
        self.table = table

    def lookup(self, ids: Sequence[int]) -> tuple[RefLogps, int, int]:
        return self.table.select(ids), len(ids), 0


class VersionedRefLogps:
    """Reference log-probs memoised by pair id for one reference version (a moving reference).

    ``compute(ids)`` runs the reference on those pairs (a forward, collective under FSDP/TP);
    ``version()`` is the strategy's version; ``any_rank(flag)`` is True when ``flag`` is True on any
    data-parallel rank. When any rank misses, every rank runs ``compute`` (a rank with no misses on
    one of its pairs, discarded) so the sharded forward has every rank in it.
    """

    def __init__(self, compute: Callable[[list[int]], RefLogps], version: Callable[[], int],
                 any_rank: Callable[[bool], bool] = lambda flag: flag):
        self.compute, self.version, self.any_rank = compute, version, any_rank
        self._version = version()
        self._memo: dict[int, RefLogps] = {}
        self.computed_rows = 0
        """Rows computed so far (all versions)."""

    def lookup(self, ids: Sequence[int]) -> tuple[RefLogps, int, int]:
        if self.version() != self._version:  # the reference moved: every memoised value is stale
            self._memo.clear()
            self._version = self.version()
        missing = [i for i in dict.fromkeys(ids) if i not in self._memo]
        if self.any_rank(bool(missing)):
            rows = self.compute(missing or [ids[0]])
            if missing:
                self._memo.update({i: rows.select([k]) for k, i in enumerate(missing)})
                self.computed_rows += len(missing)
        return RefLogps.cat([self._memo[i] for i in ids]), len(ids) - len(missing), len(missing)


class UncachedRefLogps:
    """No cache: the reference runs on every batch (``algo.precompute_ref=false``)."""

    def __init__(self, compute: Callable[[list[int]], RefLogps]):
        self.compute = compute

    def lookup(self, ids: Sequence[int]) -> tuple[RefLogps, int, int]:
        return self.compute(list(ids)), 0, len(ids)
