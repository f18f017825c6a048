"""No crafted DCP ``.metadata`` runs code: a corpus of gadget pickles (tests/helpers/pickle_gadgets.py: dotted
names that protocol 4 resolves by attribute walk, ``builtins.eval``/``exec``/``getattr``/``__import__``,
``functools.partial``, ``operator.methodcaller``, ``ctypes.CDLL``, ``torch.load``, ``os.system``), each of which
creates its marker file when plain ``pickle`` loads it, is refused in one line by the restricted unpickler
(refexp/record/safe_pickle.py) through every reader refexp has, and no marker is ever created. The unpickler admits
exactly the (module, name) pairs a DCP checkpoint holds, each only where it lives, and sets the state of DCP's
records alone."""

from __future__ import annotations

import io
import os
import pathlib
import pickle
import shutil
import subprocess
import sys

import pytest
import torch

from refexp import titan
from refexp.config import ConfigError, ModelConfig
from refexp.record.cache_dirs import verified_entry, write_entry_manifest
from refexp.record.checkpoints import dcp_structure_mismatch, newest_verified_step, write_manifest
from refexp.record.safe_pickle import UnsafePickle, read_dcp_metadata, restricted_load
from tests.helpers.pickle_gadgets import GADGETS, METADATA, NONE, call, glob, plant, program, text

TINY = ModelConfig(dim=32, n_layers=1, n_heads=2, n_kv_heads=2, ffn_hidden_dim=64, max_seq_len=32)
READERS = ["sft.checkpoint", "cache", "resume", "reference.checkpoint", "checkpoint.initial_load_path"]
POPEN = GADGETS[0]  # the dotted Popen the red team ran through sft.checkpoint, the cache and a resume


@pytest.fixture(scope="module")
def real_dcp(tmp_path_factory):
    """A model-only DCP checkpoint refexp writes (``titan.save_model_weights``), copied wherever a test plants."""
    titan.prepare_torchtitan("cpu")
    out = tmp_path_factory.mktemp("real") / "model"
    titan.save_model_weights(titan.build_model(TINY, vocab_size=17, device="cpu", seed=1), out)
    return out


def assert_refused_in_one_line(message: str, f, gadget) -> None:
    assert "refused" in message and str(f) in message and f"{gadget.module}.{gadget.name}" in message, message
    assert "\n" not in message


@pytest.mark.parametrize("gadget", GADGETS, ids=lambda g: g.id)
def test_every_gadget_runs_under_plain_pickle(tmp_path, gadget):
    """The control: each gadget is a real attack (torch's own ``FileSystemReader`` loads with plain pickle)."""
    marker = tmp_path / "ran"
    try:
        pickle.loads(gadget.build(marker))
    except Exception:
        pass  # torch.load fails on the side file's contents after its pickle ran
    assert marker.exists()


@pytest.mark.parametrize("gadget", GADGETS, ids=lambda g: g.id)
def test_the_restricted_unpickler_refuses_every_gadget_unrun(tmp_path, gadget):
    marker = tmp_path / "ran"
    f = plant(tmp_path / "ck", gadget, marker)
    with pytest.raises(UnsafePickle) as e:
        read_dcp_metadata(tmp_path / "ck")
    assert_refused_in_one_line(str(e.value), f, gadget)
    assert "refused to load" in dcp_structure_mismatch(tmp_path / "ck")  # a checkpoint without a manifest
    assert not marker.exists()


def planted_reader(reader: str, tmp_path, real_dcp, plant_into, model=None):
    """``reader``'s layout with ``plant_into(dcp_dir)`` (which returns the file it wrote) planted in its DCP dir and
    every manifest re-sealed (whoever can write the file can write its manifest too); returns (the planted file, the
    calls that read it as a run does, loading into ``model``).
    sft.checkpoint: the tokenizer check (``start_embedding_rows``) and the load; the cache: an SFT entry that
    verifies, then its load; a resume: the step chosen by its manifest, ``is_model_only`` and torchtitan's
    ``dcp_load``; reference.checkpoint: a run dir (``build_frozen`` loads its newest verified step);
    checkpoint.initial_load_path: a ``step-N`` dir (``build_policy``)."""
    from refexp.components.checkpoint import is_model_only
    from refexp.components.tokenizer_start import start_embedding_rows
    from refexp.titan.optim_checkpoint import CheckpointManager

    model = model or titan.build_model(TINY, vocab_size=17, device="cpu", seed=1)

    def load(path):
        return lambda: titan.load_weights(model, TINY, path)

    if reader in ("sft.checkpoint", "cache"):
        entry = tmp_path / ("start" if reader == "sft.checkpoint" else "cache/sft/0123456789abcdef")
        shutil.copytree(real_dcp, entry / "model")
        (entry / "sft.json").write_text("{}")
        f = plant_into(entry / "model")
        write_entry_manifest(entry)
        verified_entry(entry, "SFT model")  # the manifest passes: only the unpickler stands in the way
        calls = [load(entry)]
        if reader == "sft.checkpoint":
            calls.insert(0, lambda: start_embedding_rows(entry))
        return f, calls
    run_dir = tmp_path / "run"
    step = run_dir / "checkpoint" / "step-2"
    shutil.copytree(real_dcp, step)
    f = plant_into(step)
    write_manifest(step, checksums=True)
    assert newest_verified_step(run_dir / "checkpoint") == 2
    if reader == "resume":
        manager = CheckpointManager.__new__(CheckpointManager)  # dcp_load reads no attribute before the check
        return f, [lambda: is_model_only(step),
                   lambda: manager.dcp_load({}, str(step), from_hf=False, from_quantized=False)]
    return f, [load(run_dir if reader == "reference.checkpoint" else step)]


@pytest.mark.parametrize("gadget", GADGETS, ids=lambda g: g.id)
@pytest.mark.parametrize("reader", READERS)
def test_every_reader_refuses_every_gadget_in_one_line_unrun(tmp_path, real_dcp, reader, gadget):
    marker = tmp_path / "ran"
    f, calls = planted_reader(reader, tmp_path, real_dcp, lambda d: plant(d, gadget, marker))
    for read in calls:
        with pytest.raises(ConfigError) as e:
            read()
        assert_refused_in_one_line(str(e.value), f, gadget)
    assert not marker.exists()


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    """Another model's checkpoint outside every planted dir: its shard is the readable file of known bytes (seed 2's
    weights) that a crafted ``.metadata`` points the readers at."""
    out = tmp_path_factory.mktemp("outside") / "model"
    titan.save_model_weights(titan.build_model(TINY, vocab_size=17, device="cpu", seed=2), out)
    return out


ESCAPES = ["absolute", "dotdot", "symlink"]


def plant_escape(dcp_dir: pathlib.Path, escape: str, outside: pathlib.Path) -> pathlib.Path:
    """``dcp_dir/.metadata`` replaced by ``outside``'s with every shard entry's ``relative_path`` naming ``outside``'s
    shard: its absolute path, a ``../`` path, or a link in ``dcp_dir`` to it (a real DCP file name); returns the
    file. A pickle of DCP's own records only: the unpickler admits it, and torch's reader follows the path."""
    (shard,) = outside.glob("*.distcp")
    rel = {"absolute": str(shard), "dotdot": os.path.relpath(shard, dcp_dir), "symlink": "__0_1.distcp"}[escape]
    if escape == "symlink":
        (dcp_dir / rel).symlink_to(shard)
    metadata = read_dcp_metadata(outside)
    for info in metadata.storage_data.values():
        info.relative_path = rel
    f = dcp_dir / ".metadata"
    f.write_bytes(pickle.dumps(metadata, protocol=4))
    return f


def weights(seed: int) -> dict[str, torch.Tensor]:
    return titan.build_model(TINY, vocab_size=17, device="cpu", seed=seed).state_dict()


@pytest.mark.parametrize("escape", ESCAPES)
def test_every_escape_reads_the_outside_file_under_torchs_reader(tmp_path, real_dcp, outside, escape):
    """The control: torch's own ``FileSystemReader`` follows each crafted path and loads the outside file's bytes."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    shutil.copytree(real_dcp, tmp_path / "ck")
    plant_escape(tmp_path / "ck", escape, outside)
    state = weights(3)
    dcp.load(state, storage_reader=FileSystemReader(str(tmp_path / "ck")))
    assert all(torch.equal(v, weights(2)[k]) for k, v in state.items())


@pytest.mark.parametrize("escape", ESCAPES)
@pytest.mark.parametrize("reader", READERS)
def test_every_reader_refuses_a_shard_path_out_of_its_dir_and_loads_nothing(tmp_path, real_dcp, outside, reader,
                                                                             escape):
    """A ``.metadata`` of DCP's own records whose shards lie outside the checkpoint dir (an absolute path, ``..``, a
    link out) would read any readable file into the weights: each reader refuses it in one line naming the file and
    the path, and the model keeps the weights it had."""
    model = titan.build_model(TINY, vocab_size=17, device="cpu", seed=3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    f, calls = planted_reader(reader, tmp_path, real_dcp, lambda d: plant_escape(d, escape, outside), model)
    rel = next(iter(pickle.loads(f.read_bytes()).storage_data.values())).relative_path  # the file we just wrote
    for read in calls:
        with pytest.raises(ConfigError) as e:
            read()
        message = str(e.value)
        assert "refused" in message and str(f) in message and rel in message and "\n" not in message, message
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


BAD_ENTRIES = {  # a shard entry's field and a value torch's writer never writes there
    "a negative offset": ("offset", -1), "a negative length": ("length", -8), "a float offset": ("offset", 0.5),
    "a bool length": ("length", True), "a string offset": ("offset", "0"), "a missing length": ("length", None),
    "a bytes path": ("relative_path", b"__0_0.distcp"), "an empty path": ("relative_path", ""),
    "the dir itself": ("relative_path", "."), "a '..' that comes back": ("relative_path", "x/../__0_0.distcp"),
    "a NUL in the path": ("relative_path", "__0_0.distcp\0"),
}


@pytest.mark.parametrize("bad", list(BAD_ENTRIES))
def test_a_shard_entry_outside_what_dcp_writes_is_refused_by_both_readers(tmp_path, real_dcp, bad):
    """Offsets and lengths are non-negative ints and a path a plain name inside the dir, checked where ``.metadata``
    is read for a check (``read_dcp_metadata``) and again where it is read to load (``SafeFileSystemReader``)."""
    from refexp.titan.dcp_reader import SafeFileSystemReader

    field, value = BAD_ENTRIES[bad]
    shutil.copytree(real_dcp, tmp_path / "ck")
    metadata = read_dcp_metadata(tmp_path / "ck")
    info = next(iter(metadata.storage_data.values()))
    setattr(info, field, value)  # None: dropped by _StorageInfo.__getstate__, so the entry has no such field
    (tmp_path / "ck" / ".metadata").write_bytes(pickle.dumps(metadata, protocol=4))
    for read in (lambda: read_dcp_metadata(tmp_path / "ck"),
                 lambda: SafeFileSystemReader(str(tmp_path / "ck")).read_metadata()):
        with pytest.raises(UnsafePickle, match="refused to load") as e:
            read()
        assert str(tmp_path / "ck" / ".metadata") in str(e.value) and "\n" not in str(e.value)


def test_a_metadata_that_is_no_dcp_record_is_refused(tmp_path):
    from torch.distributed.checkpoint.metadata import Metadata

    for what in ([1, 2], {"storage_data": {}}, Metadata(state_dict_metadata={})):  # the last: storage_data None
        (tmp_path / ".metadata").write_bytes(pickle.dumps(what, protocol=4))
        with pytest.raises(UnsafePickle, match="refused to load"):
            read_dcp_metadata(tmp_path)


def test_a_shard_linked_in_a_loop_is_refused_in_one_line(tmp_path, real_dcp):
    shutil.copytree(real_dcp, tmp_path / "ck")
    (tmp_path / "ck" / "a.distcp").symlink_to(tmp_path / "ck" / "b.distcp")
    (tmp_path / "ck" / "b.distcp").symlink_to(tmp_path / "ck" / "a.distcp")
    metadata = read_dcp_metadata(tmp_path / "ck")
    next(iter(metadata.storage_data.values())).relative_path = "a.distcp"
    (tmp_path / "ck" / ".metadata").write_bytes(pickle.dumps(metadata, protocol=4))
    with pytest.raises(UnsafePickle, match="refused to load: .*'a.distcp'") as e:
        read_dcp_metadata(tmp_path / "ck")
    assert "\n" not in str(e.value)


def test_a_linked_checkpoint_dir_still_reads(tmp_path, real_dcp):
    """The dir itself may be a link (``sft.checkpoint=LINK``): its shards resolve inside where it points."""
    (tmp_path / "link").symlink_to(real_dcp, target_is_directory=True)
    assert read_dcp_metadata(tmp_path / "link").storage_data == read_dcp_metadata(real_dcp).storage_data
    model = titan.build_model(TINY, vocab_size=17, device="cpu", seed=3)
    titan.load_weights(model, TINY, tmp_path / "link")
    assert all(torch.equal(v, weights(1)[k]) for k, v in model.state_dict().items())


def test_a_real_checkpoint_reads_through_every_reader(tmp_path, real_dcp):
    """The readers above, unplanted, load the real checkpoint: what refuses the gadgets is the unpickler."""
    from refexp.components.checkpoint import is_model_only

    model = titan.build_model(TINY, vocab_size=17, device="cpu", seed=2)
    shutil.copytree(real_dcp, tmp_path / "run" / "checkpoint" / "step-2")
    write_manifest(tmp_path / "run" / "checkpoint" / "step-2", checksums=True)
    for path in (real_dcp, tmp_path / "run" / "checkpoint" / "step-2", tmp_path / "run"):
        titan.load_weights(model, TINY, path)
    assert is_model_only(real_dcp)
    want = titan.build_model(TINY, vocab_size=17, device="cpu", seed=1).state_dict()
    assert all(torch.equal(v, want[k]) for k, v in model.state_dict().items())


def loads(data: bytes):
    return restricted_load(io.BytesIO(data), name="f/.metadata")


def state(key: str) -> bytes:
    """BUILD's state ``(None, {key: "planted"})``: the slot-state form, which ``setattr``s on the target."""
    return NONE + pickle.EMPTY_DICT + pickle.MARK + text(key) + text("planted") + pickle.SETITEMS + pickle.TUPLE2


SHARED = {  # an object every later load and save of the process shares, and the pickle that reaches it
    "the class PosixPath": (lambda: pathlib.PosixPath, glob("pathlib", "PosixPath")),
    "the class Metadata": (lambda: torch.distributed.checkpoint.metadata.Metadata, glob(METADATA, "Metadata")),
    "the function _get_layout": (lambda: torch.serialization._get_layout, glob("torch.serialization", "_get_layout")),
    "an enum member": (lambda: torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT,
                       call(glob(METADATA, "_MEM_FORMAT_ENCODING"), pickle.BININT1 + bytes([0]))),
}


@pytest.mark.parametrize("target", list(SHARED))
def test_a_pickle_cannot_set_an_attribute_of_an_admitted_class_function_or_enum_member(target):
    """``BUILD`` sets the state of DCP's own records only: on an admitted class (PosixPath's ``__fspath__``), torch's
    layout lookup or ``_MEM_FORMAT_ENCODING``'s members (whose value every later save writes) it would change what
    the rest of the process reads and writes."""
    import torch.distributed.checkpoint.metadata  # noqa: F401  (SHARED's lambdas read it)

    obj = SHARED[target][0]()
    try:
        with pytest.raises(UnsafePickle, match="refused to load: it sets the state of"):
            loads(pickle.PROTO + bytes([4]) + SHARED[target][1] + state("refexp_planted") + pickle.BUILD + pickle.STOP)
        assert not hasattr(obj, "refexp_planted")
    finally:
        if "refexp_planted" in vars(obj):  # the old unpickler set it: leave the process as it was
            delattr(obj, "refexp_planted")


def test_a_name_is_admitted_only_where_it_lives(monkeypatch):
    """An admitted pair resolving to another object (a torch whose module imports the name from elsewhere) is
    refused, and so is a class a DCP module merely imports (``Enum``, which the old "any class of the metadata
    module" rule let through)."""
    from torch.distributed.checkpoint import metadata

    with pytest.raises(UnsafePickle, match=r"names torch\.distributed\.checkpoint\.metadata\.Enum,"):
        loads(program(METADATA, "Enum", b""))
    monkeypatch.setattr(metadata, "Metadata", subprocess.Popen)
    with pytest.raises(UnsafePickle, match=r"Metadata, which is subprocess\.Popen here"):
        loads(pickle.PROTO + bytes([4]) + call(glob(METADATA, "Metadata"), text("true")) + pickle.STOP)


def test_torch_names_only_its_dtypes_and_size():
    assert loads(pickle.dumps([torch.bfloat16, torch.int64, torch.Size([2, 3])], protocol=4)) == [
        torch.bfloat16, torch.int64, torch.Size([2, 3])]
    for name in ("Tensor", "_C", "load", "nn", "float32.__class__"):
        with pytest.raises(UnsafePickle, match=f"names torch.{name}"):
            loads(program("torch", name, b""))


def test_pathlib_paths_read_from_either_home():
    """``PosixPath`` lives in ``pathlib._local`` from Python 3.13 on: a checkpoint id written by either reads."""
    for module in ("pathlib", "pathlib._local"):
        data = pickle.PROTO + bytes([4]) + call(glob(module, "PosixPath"), text("/a"), text("b")) + pickle.STOP
        assert loads(data) == pathlib.PosixPath("/a/b")
    with pytest.raises(UnsafePickle):
        loads(program("pathlib", "Path", b""))  # not what a checkpoint holds


def test_a_crafted_name_is_shown_on_one_line():
    with pytest.raises(UnsafePickle) as e:
        loads(program("os\nrefexp: ok", "system\r" + "x" * 10_000, b""))
    assert "\n" not in str(e.value) and "\r" not in str(e.value) and len(str(e.value)) < 1000


@pytest.mark.slow
@pytest.mark.parametrize("reader", READERS)
def test_a_run_refuses_a_planted_gadget_through_each_reader_unrun(tmp_path, monkeypatch, reader):
    """The whole run, once per reader, with the dotted Popen: the run stops with the one-line error before it trains,
    and the payload never ran. The cache: a copy of the session's SFT entry in a cache of its own, re-sealed."""
    from refexp.run import run
    from tests.helpers.configs import TINY_GRPO_OVERRIDES, compose_tiny_run

    marker = tmp_path / "ran"
    sft_dir = pathlib.Path(run(compose_tiny_run(tmp_path / "sft", "algo=sft"))["sft/dir"])  # cached per session
    extra: list[str] = []
    if reader == "resume":
        run(compose_tiny_run(tmp_path / "run", *TINY_GRPO_OVERRIDES, "training.steps=2", "checkpoint.interval=1"))
        step = tmp_path / "run" / "checkpoint" / "step-2"
        f = plant(step, POPEN, marker)
        write_manifest(step, checksums=True)
        extra = ["training.steps=4", "checkpoint.interval=1"]
    elif reader == "cache":
        entry = tmp_path / "cache" / "sft" / sft_dir.name
        shutil.copytree(sft_dir, entry)
        f = plant(entry / "model", POPEN, marker)
        write_entry_manifest(entry)
        monkeypatch.setenv("REFEXP_CACHE", str(tmp_path / "cache"))
    else:
        start = tmp_path / "start"
        shutil.copytree(sft_dir, start)
        f = plant(start / "model", POPEN, marker)
        write_entry_manifest(start)
        extra = [f"{reader}={start}"]
    with pytest.raises(ConfigError) as e:
        run(compose_tiny_run(tmp_path / "run", *TINY_GRPO_OVERRIDES, *extra))
    assert_refused_in_one_line(str(e.value), f, POPEN)
    assert not marker.exists()


@pytest.mark.slow
def test_the_command_line_says_one_error_line_for_a_planted_start(tmp_path):
    """``refexp ... sft.checkpoint=DIR`` with the dotted Popen planted: exit 2, one ``refexp: error:`` line naming
    the file, no traceback, no marker."""
    from tests.helpers.configs import TINY_GRPO_OVERRIDES, TINY_RUN_OVERRIDES

    marker = tmp_path / "ran"
    start = tmp_path / "start"
    f = plant(start / "model", POPEN, marker)
    proc = subprocess.run([sys.executable, "-m", "refexp", *TINY_RUN_OVERRIDES, *TINY_GRPO_OVERRIDES,
                           f"run_dir={tmp_path / 'run'}", f"sft.checkpoint={start}"],
                          check=False, capture_output=True, text=True, timeout=300,
                          cwd=pathlib.Path(__file__).parents[1])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("refexp: error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert_refused_in_one_line(errors[0], f, POPEN)
    assert not marker.exists()
