"""The library's architecture, read from its source with ``ast``: layers, circles, light imports, sizes.

Every import counts (module top, function-local, under ``TYPE_CHECKING``). Each test reports all
offenders at once, one line each, so a failure says what to move.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "eaglekb"
RUNBOOKS = REPO / "runbooks"
#: Roots of the project's own modules: imports of these are followed into the graph of imports.
OURS = {"eaglekb", "runbooks", "tasks"}
#: Each package may import itself and the packages before it, never one after it.
LAYERS = ("io", "formats", "models", "engine", "data", "training", "measure", "studies", "kb")
#: Third-party roots only the knowledge base may import.
KB_ONLY = {"pydantic", "pydantic_core"}
#: The task runner, the docs tool and the repository's own scripts: never imported by the library.
FORBIDDEN = {"invoke", "mkdocs", "mike", "material", "runbooks", "tasks"}
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
#: Names that build a path into baselines/ (or the local history next to it).
BASELINE_PATH_NAMES = {"find_root", "baselines_dir", "history_dir", "path_for"}
#: Calls that write, create, move or delete a file: by name on any receiver, or as module.function.
WRITER_CALLS = {"atomic_write_text", "atomic_write_bytes", "atomic_write_json", "atomic_save_safetensors",
                "write_text", "write_bytes", "unlink", "rmtree", "copyfile", "copytree", "mkstemp",
                "NamedTemporaryFile", "save_file"}
WRITER_QUALIFIED = {"os.replace", "os.rename", "os.remove", "shutil.copy", "shutil.copy2", "shutil.move",
                    "json.dump", "torch.save"}


# --------------------------------------------------------------------------- reading the source


def _dotted(path: Path, top: Path) -> str:
    parts = list(path.relative_to(top).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@lru_cache(maxsize=None)
def modules() -> dict[str, Path]:
    """Every library module by dotted name (a package by its ``__init__``)."""
    return {_dotted(p, SRC.parent): p for p in sorted(SRC.rglob("*.py"))}


@lru_cache(maxsize=None)
def everything() -> dict[str, Path]:
    """The library, the runbooks and tasks.py by dotted name: every module whose imports may close a circle."""
    return {**modules(), **{_dotted(p, REPO): p for p in sorted(RUNBOOKS.rglob("*.py"))}, "tasks": REPO / "tasks.py"}


@lru_cache(maxsize=None)
def tree(name: str) -> ast.Module:
    path = everything()[name]
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def rel(name: str) -> str:
    return str(everything()[name].relative_to(REPO))


def package_of(name: str) -> str | None:
    """``eaglekb.kb.diff`` -> ``kb``; a top-level module (``eaglekb``, ``eaglekb.x``) -> None."""
    parts = name.split(".")
    is_package = modules()[name].name == "__init__.py"
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and is_package) else None


def _known(dotted: str, table: dict[str, Path]) -> str:
    """The module a dotted name lives in (its longest known prefix; the name itself when none is known)."""
    parts = dotted.split(".")
    while parts and ".".join(parts) not in table:
        parts.pop()
    return ".".join(parts) or dotted


def imports(name: str, table: dict[str, Path] | None = None) -> list[tuple[int, str, str | None]]:
    """(line, imported module, name taken from it) for every import in a module (top, function-local, any).

    Project targets (roots ``OURS``) are resolved to the module they live in (``from eaglekb.kb import diff``
    -> ``eaglekb.kb.diff``; ``from eaglekb import __version__`` -> ``eaglekb`` with name ``__version__``);
    relative imports are made absolute; other modules stay as written. ``table``: the modules by dotted
    name (default ``everything()``).
    """
    table = everything() if table is None else table
    path = table[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[tuple[int, str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = alias.name
                out.append((node.lineno, _known(target, table) if _root(target) in OURS else target, None))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                if _root(base) not in OURS:
                    out.append((node.lineno, base, alias.name))
                elif f"{base}.{alias.name}" in table:
                    out.append((node.lineno, f"{base}.{alias.name}", None))
                else:
                    out.append((node.lineno, _known(base, table), alias.name))
    return out


def _root(target: str) -> str:
    return target.split(".")[0]


# --------------------------------------------------------------------------- layers


def test_every_folder_is_a_package_and_no_module_shadows_one():
    """Each folder of modules has an ``__init__.py``; no ``x.py`` sits beside an ``x/`` (Python
    would import one of them and leave the other dead)."""
    folders = {p.parent for p in SRC.rglob("*.py")}
    problems = [f"{f.relative_to(REPO)}/ has no __init__.py" for f in sorted(folders) if not (f / "__init__.py").is_file()]
    problems += [f"{p.relative_to(REPO)} beside {p.with_suffix('').relative_to(REPO)}/"
                 for p in sorted(SRC.rglob("*.py")) if p.name != "__init__.py" and p.with_suffix("").is_dir()]
    assert problems == [], "\n".join(problems)


def test_packages_are_in_the_layer_order():
    packages = sorted({p for p in map(package_of, modules()) if p is not None})
    unknown = [p for p in packages if p not in LAYERS]
    assert unknown == [], f"packages missing from LAYERS (add them where they belong): {unknown}"


def _layer_offence(name: str, target: str, taken: str | None) -> str | None:
    here, there = package_of(name), package_of(target)
    if target == "eaglekb":  # the root package: its version only
        return None if taken == "__version__" else (
            f"takes {taken!r} from eaglekb (only __version__ lives there)" if taken
            else "imports the root package, or a module that does not exist")
    if here is None:
        return "a top-level module imports nothing of eaglekb but its version"
    if there is None or there not in LAYERS or here not in LAYERS:
        return None  # reported by test_packages_are_in_the_layer_order
    if LAYERS.index(there) > LAYERS.index(here):
        return f"{here} may not import {there} (layers: {' < '.join(LAYERS)})"
    return None


def test_each_package_imports_only_itself_and_packages_below():
    offenders = []
    for name in modules():
        for line, target, taken in imports(name):
            if _root(target) != "eaglekb":
                continue
            why = _layer_offence(name, target, taken)
            if why:
                offenders.append(f"{rel(name)}:{line} imports {target}: {why}")
    assert offenders == [], "\n".join(offenders)


def _graph(table: dict[str, Path] | None = None) -> dict[str, dict[str, int]]:
    """Module -> {module importing it runs: the line of that import}, parent packages included (importing
    ``eaglekb.engine.kv`` runs ``eaglekb/engine/__init__.py`` first). Every import counts: module top,
    function-local, under ``TYPE_CHECKING``; ``table`` as for ``imports``."""
    table = everything() if table is None else table
    graph: dict[str, dict[str, int]] = {name: {} for name in table}
    for name in table:
        mine = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
        for line, target, _ in imports(name, table):
            if _root(target) not in OURS:
                continue
            parts = target.split(".")
            runs = {".".join(parts[:i]) for i in range(1, len(parts) + 1)} - mine
            for t in sorted(runs):
                if t in table and t != name:
                    graph[name].setdefault(t, line)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_circle_finder_finds_circles():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def _circle_lines(table: dict[str, Path] | None = None, root: Path = REPO) -> list[str]:
    """One line per circle of imports: each import inside it as ``a -> b (file:line)``, files from ROOT."""
    table = everything() if table is None else table
    graph = _graph(table)
    return ["circle: " + ", ".join(f"{a} -> {b} ({table[a].relative_to(root).as_posix()}:{graph[a][b]})"
                                   for a in circle for b in sorted(graph[a]) if b in circle)
            for circle in _circles({k: set(v) for k, v in graph.items()})]


def test_no_import_circles():
    """No circle of imports anywhere in the library, the runbooks or tasks.py (function-local imports
    count: a circle hidden inside a function is still one); a circle is named with each import in it."""
    lines = _circle_lines()
    assert lines == [], "move the shared piece into the lower module:\n" + "\n".join(lines)


def test_a_circle_through_function_local_imports_is_found(tmp_path):
    (tmp_path / "runbooks").mkdir()
    (tmp_path / "runbooks" / "__init__.py").write_text('"""pkg"""\n')
    (tmp_path / "runbooks" / "low.py").write_text("def f():\n    from runbooks.high import g\n")
    (tmp_path / "runbooks" / "high.py").write_text("from runbooks import low\n\ndef g():\n    pass\n")
    (tmp_path / "runbooks" / "leaf.py").write_text("from runbooks.low import f\n")
    table = {_dotted(p, tmp_path): p for p in sorted(tmp_path.rglob("*.py"))}
    assert _circle_lines(table, tmp_path) == ["circle: runbooks.high -> runbooks.low (runbooks/high.py:1), "
                                    "runbooks.low -> runbooks.high (runbooks/low.py:2)"]


def test_no_function_local_imports_of_the_library():
    """Library imports sit at module top, where the layers and circles above can be seen
    (function-local ones hid a circle); only heavy third-party imports may wait inside a function."""
    offenders = []
    for name in modules():
        for func in ast.walk(tree(name)):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                targets = ([a.name for a in node.names] if isinstance(node, ast.Import)
                           else [node.module or "."] if isinstance(node, ast.ImportFrom) and not node.level
                           else ["."] if isinstance(node, ast.ImportFrom) else [])
                if any(t == "." or _root(t) == "eaglekb" for t in targets):
                    offenders.append(f"{rel(name)}:{node.lineno} in {func.name}()")
    assert offenders == [], "\n".join(sorted(set(offenders)))


def test_only_kb_imports_pydantic():
    offenders = [f"{rel(name)}:{line} imports {target}"
                 for name in modules() if package_of(name) != "kb"
                 for line, target, _ in imports(name) if _root(target) in KB_ONLY]
    assert offenders == [], "\n".join(offenders)


def test_library_imports_no_runner_docs_tool_or_runbooks():
    offenders = [f"{rel(name)}:{line} imports {target}"
                 for name in modules() for line, target, _ in imports(name) if _root(target) in FORBIDDEN]
    assert offenders == [], "\n".join(offenders)


_BLOCKED_IMPORT = """
import importlib, json, sys, traceback

class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"pydantic", "pydantic_core", "invoke"}:
            raise ImportError(f"{name} is blocked: this module must import without it")
        return None

sys.meta_path.insert(0, Blocked())
failed = {}
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except BaseException as exc:
        failed[name] = traceback.format_exception_only(type(exc), exc)[-1].strip()
print(json.dumps(failed))
"""


def test_every_package_but_kb_imports_without_pydantic_or_invoke():
    """The GPU path stays light: all of the library below kb imports with pydantic and invoke blocked."""
    names = [n for n in modules() if package_of(n) != "kb" and not n.endswith(".__main__")]
    out = subprocess.run([sys.executable, "-c", _BLOCKED_IMPORT, json.dumps(names)], capture_output=True,
                         text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    failed = json.loads(out.stdout.strip().splitlines()[-1])
    assert failed == {}, "\n".join(f"{name}: {why}" for name, why in failed.items())


# --------------------------------------------------------------------------- sizes and docstrings


def test_no_module_over_500_lines():
    long = [f"{rel(n)}: {len(p.read_text(encoding='utf-8').splitlines())} lines"
            for n, p in modules().items() if len(p.read_text(encoding="utf-8").splitlines()) > MAX_MODULE_LINES]
    assert long == [], f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(long)


def test_no_function_over_80_lines():
    long = [f"{rel(name)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
            for name in modules() for node in ast.walk(tree(name))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == [], f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_every_module_has_a_docstring():
    missing = [rel(n) for n in modules() if not ast.get_docstring(tree(n))]
    assert missing == []


# --------------------------------------------------------------------------- baselines/ by path


def _docstrings(module: ast.Module) -> set[int]:
    """ids of the string nodes that are docstrings (module, class, function)."""
    out = set()
    for node in ast.walk(module):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _baseline_path_refs(name: str) -> list[str]:
    """Where a module builds a path into baselines/: a path helper's name, or ``"baselines"``
    as a path part in a string (docstrings aside)."""
    module = tree(name)
    skip = _docstrings(module)
    refs = []
    for node in ast.walk(module):
        if isinstance(node, ast.Name) and node.id in BASELINE_PATH_NAMES:
            refs.append(f"{node.lineno} {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in BASELINE_PATH_NAMES:
            refs.append(f"{node.lineno} .{node.attr}")
        elif isinstance(node, ast.alias) and node.name.split(".")[-1] in BASELINE_PATH_NAMES:
            refs.append(f"{getattr(node, 'lineno', '?')} import {node.name}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            text = node.value
            if text.strip("/") == "baselines" or "baselines/" in text or "/baselines" in text:
                refs.append(f"{node.lineno} {text[:40]!r}")
    return refs


def _writes(name: str) -> list[str]:
    """Calls in a module that write, move or delete files (by the called name), and open() for writing."""
    found = []
    for node in ast.walk(tree(name)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
        if called in WRITER_CALLS or f"{owner}.{called}" in WRITER_QUALIFIED:
            found.append(f"{node.lineno} {called}()")
        elif called == "open":
            modes = [a.value for a in node.args[1:2] if isinstance(a, ast.Constant)]
            modes += [k.value.value for k in node.keywords if k.arg == "mode" and isinstance(k.value, ast.Constant)]
            if any(isinstance(m, str) and set(m) & set("wax+") for m in modes):
                found.append(f"{node.lineno} open({modes[0]!r})")
    return found


def test_only_kb_builds_paths_into_baselines():
    """Outside kb, no module names a path into baselines/: it cannot write there by hand."""
    offenders = [f"{rel(name)}:{ref}" for name in modules() if package_of(name) != "kb"
                 for ref in _baseline_path_refs(name)]
    assert offenders == [], "\n".join(offenders)


def test_only_the_writer_writes_where_it_builds_baselines_paths():
    """In kb, a module that builds paths into baselines/ and also writes files is the writer alone."""
    writer = "eaglekb.kb.baselines"
    offenders = [f"{rel(name)}: builds baselines paths ({_baseline_path_refs(name)[0]}) and writes "
                 f"({', '.join(_writes(name)[:3])})"
                 for name in modules() if name != writer and _baseline_path_refs(name) and _writes(name)]
    assert offenders == [], "\n".join(offenders)
    assert _writes(writer), "the writer no longer writes: update WRITER_CALLS"


_AUDIT_RECORD = """
import json, os, runpy, sys

root = os.path.realpath(os.environ["EAGLEKB_ROOT"])
base = os.path.join(root, "baselines") + os.sep
writers = []

def library_frame():
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("eaglekb.") and module != "eaglekb.io.files":
            return module
        if module.startswith(("runbooks", "tasks")):
            return module
        frame = frame.f_back
    return "?"

def hook(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        path, mode, flags = args
        writing = (mode is not None and set(str(mode)) & set("wax+")) or (mode is None and flags & 3)
    elif event in ("os.rename", "os.replace", "os.remove", "os.mkdir", "shutil.copyfile", "shutil.move"):
        path, writing = args[1] if event in ("os.rename", "os.replace") else args[0], True
    else:
        return
    if writing and os.path.realpath(os.fsdecode(path)).startswith(base):
        writers.append([library_frame(), os.path.relpath(os.fsdecode(path), root)])

sys.addaudithook(hook)
sys.argv = ["invoke"] + sys.argv[1:]
try:
    runpy.run_module("invoke", run_name="__main__", alter_sys=True)
except SystemExit as exc:
    code = exc.code
else:
    code = 0
sys.stdout.flush()
print("\\nWRITERS " + json.dumps(writers))
sys.exit(code or 0)
"""


def test_recording_writes_baselines_only_through_the_writer(tmp_path):
    """Behaviour, by path: `invoke plan --record` in a scratch root; every write under its baselines/
    comes from eaglekb.kb.baselines."""
    (tmp_path / "baselines").mkdir()
    (tmp_path / "mkdocs.yml").write_text("site_name: scratch\n")
    args = ["--search-root", str(REPO), "plan", "--baseline-tps", "82", "--cycle-ms", "30",
            "--accept-len", "2.0", "--steps", "2", "--record", "arch-check"]
    out = subprocess.run([sys.executable, "-c", _AUDIT_RECORD, *args], capture_output=True, text=True,
                         timeout=300, cwd=REPO, env={**os.environ, "EAGLEKB_ROOT": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    writers = json.loads(out.stdout.rsplit("WRITERS ", 1)[1])
    assert (tmp_path / "baselines/plan/arch-check.json").is_file()
    assert writers, "no write seen under baselines/: the audit hook missed the writer"
    assert {module for module, _ in writers} == {"eaglekb.kb.baselines"}, writers
