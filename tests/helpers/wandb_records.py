"""What W&B received, read back from an offline run's ``run-*.wandb`` file (no server here).

The file is a LevelDB-style log (what ``wandb sync`` uploads): a 7-byte header (``:W&B``, magic 0xBEE1,
version), then 32 KiB blocks of chunks, each with a 7-byte header (crc32, length, type: full / first /
middle / last), whose payloads join into serialized ``wandb_internal_pb2.Record`` protobufs.
"""

from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

from wandb.proto import wandb_internal_pb2 as pb

FILE_HEADER = 7
BLOCK = 32 * 1024
CHUNK_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: str | Path):
    """Every Record of a ``.wandb`` file, in order."""
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, buf = FILE_HEADER, b""
    while pos + CHUNK_HEADER <= len(data):
        if BLOCK - pos % BLOCK < CHUNK_HEADER:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + CHUNK_HEADER])
        chunk = data[pos + CHUNK_HEADER:pos + CHUNK_HEADER + length]
        pos += CHUNK_HEADER + length
        if kind == FULL:
            buf = chunk
        elif kind == FIRST:
            buf = chunk
            continue
        elif kind in (MIDDLE, LAST):
            buf += chunk
            if kind == MIDDLE:
                continue
        else:  # zero padding at the end of the file
            continue
        record = pb.Record()
        record.ParseFromString(buf)
        yield record


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


@dataclass
class OfflineRun:
    """The parts of an offline run a test asserts on."""

    group: str = ""
    job_type: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    metric_summaries: dict[str, str] = field(default_factory=dict)
    """metric -> the summary W&B keeps for it (max / min / last / mean), from define_metric."""


def finished_records(path: str | Path, timeout: float = 30.0) -> list:
    """The records of a finished run's file, once its last one is the run's ``exit`` record. W&B's service
    (a separate process) writes the file and may still be writing it when ``wandb.finish()`` has returned, so a
    file read at once can lack records, all of them on a loaded machine. After ``timeout`` seconds, whatever the
    file holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = list(records(path))
        except Exception:  # a header or a chunk not written whole yet
            got = []
        if got and got[-1].WhichOneof("record_type") == "exit":
            return got
        time.sleep(0.05)
    return list(records(path))


def read_offline_run(wandb_file: str | Path) -> OfflineRun:
    out = OfflineRun()
    for r in finished_records(wandb_file):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            out.group, out.job_type, out.tags = r.run.run_group, r.run.job_type, list(r.run.tags)
            out.config.update({_key(i): json.loads(i.value_json) for i in r.run.config.update})
        elif kind == "config":
            out.config.update({_key(i): json.loads(i.value_json) for i in r.config.update})
        elif kind == "history":
            out.history.append({_key(i): json.loads(i.value_json) for i in r.history.item})
        elif kind == "summary":
            out.summary.update({_key(i): json.loads(i.value_json) for i in r.summary.update})
        elif kind == "metric" and r.metric.HasField("summary"):
            s = r.metric.summary
            out.metric_summaries[r.metric.name] = next(
                k for k in ("max", "min", "last", "mean", "best", "first") if getattr(s, k, False))
    return out
