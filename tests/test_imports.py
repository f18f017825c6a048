"""The modules of refexp respect the layer table of docs/architecture.md and import each other as a tree.

Layers: the table lists every module and package of ``refexp/`` (and ``bench/``, ``launch/``, ``scripts/`` as the
top layer), top layer first, one row per folder of ``refexp/`` (the folders are the layers); a module imports only
modules of its own layer and of the layers below, counting imports inside functions too. A module missing from the
table fails, so a new module gets a layer when it is added. ``layer_violations(root)`` takes a tree's root, so a test
plants an upward import in a copy.

Cycles: a cycle works until someone moves an import to module level, and then fails with a partially
initialised module; keeping the graph acyclic keeps every module importable on its own.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = Path("docs") / "architecture.md"
TOP_LAYER_DIRS = ("bench/", "launch/", "scripts/")  # scripts that may import anything in refexp


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(name: str, modules: set[str]) -> str | None:
    """The refexp module ``name`` refers to: itself, or the longest module prefix (``a.b.func`` -> ``a.b``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the refexp modules it imports anywhere in its source (top level or in a function)."""
    files = {_module_name(p, root): p for p in (root / "refexp").rglob("*.py")}
    modules = set(files)
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = mod if is_pkg else mod.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        pkg = pkg.rpartition(".")[0]
                    base = f"{pkg}.{base}" if base else pkg
                targets = [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                if (r := _resolve(t, modules)) is not None and r != mod:
                    edges.add(r)
        graph[mod] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (c := visit(n)):
                return c
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (c := visit(m)):
            return c
    return None


# ---------------------------------------------------------------- the layer table
def layer_table(doc: Path) -> list[tuple[str, list[str]]]:
    """The "## Layers" table of ``doc``, top layer first: (layer, the paths its files cell names in backticks)."""
    lines = doc.read_text().split("\n## Layers\n", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    rows = lines[start + 2:end]  # the section's first table, after its header and |---|
    table = []
    for row in rows:
        layer, files = (cell.strip() for cell in row.strip("|").split("|")[:2])
        table.append((layer, re.findall(r"`([^`]+)`", files)))
    return table


def _covers(entry: str, module: str) -> bool:
    """Whether a table entry (``refexp/algos/`` a package, ``refexp/run.py`` a module) holds ``module``."""
    if entry.endswith("/"):
        package = entry.rstrip("/").replace("/", ".")
        return module == package or module.startswith(package + ".")
    return entry.endswith(".py") and _module_name(Path(entry), Path(".")) == module


def layer_violations(root: Path = ROOT) -> list[str]:
    """What in the tree at ``root`` contradicts its docs/architecture.md layer table: a refexp module in no
    layer, a top-layer directory missing or not on top, an import of a module from a layer above."""
    table = layer_table(root / ARCHITECTURE)
    problems = [f"{d} is not in the top layer (the first row)" for d in TOP_LAYER_DIRS if d not in table[0][1]]
    folders = {f"refexp/{p.parent.name}/" for p in (root / "refexp").glob("*/__init__.py")}
    for layer, entries in table:
        named = [e for e in entries if e.startswith("refexp/") and e.endswith("/")]
        if len(named) > 1:
            problems.append(f"the {layer} row names {len(named)} folders of refexp/: one row per folder")
        if any(e.startswith("refexp/") and e.count("/") > 1 and not e.endswith("/") for e in entries):
            problems.append(f"the {layer} row names a module inside a folder: a folder is its layer")
    listed = {e for _, entries in table for e in entries}
    problems += [f"{f} has no row of its own in {ARCHITECTURE}" for f in sorted(folders - listed)]
    graph = import_graph(root)
    rank: dict[str, int] = {}
    for module in graph:
        found = [i for i, (_, entries) in enumerate(table) if any(_covers(e, module) for e in entries)]
        if len(found) != 1:
            problems.append(f"{module} is in {len(found) or 'no'} layers of {ARCHITECTURE}")
        else:
            rank[module] = found[0]
    for module, imported in sorted(graph.items()):
        for dep in sorted(imported):
            if module in rank and dep in rank and rank[dep] < rank[module]:
                problems.append(f"{module} ({table[rank[module]][0]}) imports {dep} from the layer above it "
                                f"({table[rank[dep]][0]})")
    return problems


# ---------------------------------------------------------------- tests
def test_refexp_imports_form_a_tree():
    graph = import_graph()
    assert "refexp.run" in graph and "refexp.algos.loop" in graph
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_find_cycle_sees_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_every_module_imports_only_its_layer_and_those_below():
    table = layer_table(ROOT / ARCHITECTURE)
    assert [layer for layer, _ in table][:2] == ["entry points", "face"] and len(table) >= 6
    problems = layer_violations()
    assert not problems, "\n".join(problems)


def _scratch_copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "refexp", tmp_path / "refexp", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / ARCHITECTURE).parent.mkdir()
    shutil.copy(ROOT / ARCHITECTURE, tmp_path / ARCHITECTURE)
    assert layer_violations(tmp_path) == []
    return tmp_path


def test_an_upward_import_planted_in_a_scratch_copy_fails(tmp_path):
    root = _scratch_copy(tmp_path)
    kl = root / "refexp" / "losses" / "kl.py"
    kl.write_text(kl.read_text() + "\n\ndef _planted():\n    import refexp.run  # noqa: F401\n")
    assert layer_violations(root) == ["refexp.losses.kl (losses) imports refexp.run from the layer above it (run)"]


def test_a_folder_sharing_a_row_fails(tmp_path):
    root = _scratch_copy(tmp_path)
    doc = root / ARCHITECTURE
    lines = doc.read_text().splitlines(keepends=True)
    tasks_row = next(line for line in lines if line.startswith("| tasks | `refexp/tasks/` |"))
    text = "".join(line for line in lines if line is not tasks_row)
    doc.write_text(text.replace("| titan | `refexp/titan/` |", "| titan | `refexp/titan/`, `refexp/tasks/` |", 1))
    assert layer_violations(root) == ["the titan row names 2 folders of refexp/: one row per folder"]


def test_a_module_missing_from_the_table_fails(tmp_path):
    root = _scratch_copy(tmp_path)
    (root / "refexp" / "unlisted.py").write_text("")
    assert layer_violations(root) == [f"refexp.unlisted is in no layers of {ARCHITECTURE}"]


REPORT_ROOMS = ("reading", "statistics", "writing", "sections", "power")
"""refexp/report/'s rooms, each importing only the ones before it: a report is read, computed, written as blocks,
said by its sections; the power plan reads the first two."""


def test_report_rooms_import_only_the_rooms_before_them():
    room = {m: m.split(".")[2] for m in import_graph() if m.count(".") >= 3 and m.split(".")[2] in REPORT_ROOMS}
    upward = [f"{m} imports {d}" for m, deps in import_graph().items() if m in room for d in sorted(deps)
              if d in room and REPORT_ROOMS.index(room[d]) > REPORT_ROOMS.index(room[m])]
    assert set(room.values()) == set(REPORT_ROOMS) and not upward, "\n".join(upward)


def test_the_record_and_the_report_import_without_torch():
    """record/ (provenance, overrides, hashing and cache dirs included) and report/ read runs without torch."""
    import subprocess
    import sys

    code = ("import importlib, pkgutil, sys; import refexp.record as r, refexp.report as p; "
            "[importlib.import_module(m.name) for pkg in (r, p) for m in pkgutil.walk_packages(pkg.__path__, "
            "pkg.__name__ + '.')]; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False", out.stderr
