"""Layering: the library never imports the task runner, the docs tool or runbooks (read with ast)."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "eaglekb"
FORBIDDEN = {"invoke", "mkdocs", "runbooks", "tasks", "mike", "material"}


def _imports(path: Path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module


def test_library_imports_no_runner_or_docs_tool():
    offenders = [
        f"{p.relative_to(SRC.parent)}:{line} imports {name}"
        for p in sorted(SRC.rglob("*.py"))
        for line, name in _imports(p)
        if name.split(".")[0] in FORBIDDEN
    ]
    assert offenders == []


def test_only_baselines_module_writes_baselines_folder():
    """Other modules may read baselines/ but must go through eaglekb.kb.baselines to write."""
    writers = []
    for p in sorted(SRC.rglob("*.py")):
        if p.name == "baselines.py":
            continue
        text = p.read_text()
        if "atomic_write_text(" in text and "baselines" in text and "history" not in text:
            writers.append(str(p))
    assert writers == []


def test_every_module_has_a_docstring():
    missing = [str(p) for p in sorted(SRC.rglob("*.py")) if not ast.get_docstring(ast.parse(p.read_text()))]
    assert missing == []
