"""HumanEval-shaped function stubs read from an installed package's Python source with ``ast``.

Owns: finding a package's documented public top-level functions (no tests folders, no ``conftest.py``, no
private module or name, no trivially short docstring) and writing each as the stub HumanEval gives a model
to complete: an imports line where the docstring uses one, the ``def`` header as written (decorators
dropped) and the docstring, closed, cut to a character budget by whole numpydoc sections (the summary,
then Parameters, Returns, Yields, Raises, Examples while they fit; See Also, Notes, References dropped),
and the fixed wrappers a stub is asked in (the first is HumanEval's own).

Reads source text only: never imports or executes the package's modules. Knows nothing about corpora,
splits, tokenizers or the task runner.
"""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

STUB_MAX_CHARS = 1400  # a stub is at most this long (its wrapper adds < 100 characters); longer ones are cut
MIN_DOC_CHARS = 40  # docstrings shorter than this (once cleaned) say too little to implement from
KEEP_SECTIONS = ("Parameters", "Returns", "Yields", "Raises", "Examples")
#: The imports line a stub opens with when its docstring uses the package's usual alias.
IMPORTS = {"networkx": ("nx.", "import networkx as nx")}
#: The wrappers a stub is asked in ({q}: the stub); the first is HumanEval's own.
STUB_TEMPLATES = (
    "Complete this Python function.\n\n```python\n{q}```",
    "Implement the function below so that it does what its docstring says.\n\n```python\n{q}```",
    "Write the body of this Python function.\n\n```python\n{q}```",
    "```python\n{q}```\n\nComplete the function above.",
    "Here is a function signature with its docstring:\n\n```python\n{q}```\n\nWrite the implementation.",
    "Finish the following Python code and return the whole function.\n\n```python\n{q}```",
)


def _blocks(lines: list[str]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """A docstring's source lines -> (its preamble, [(section title, section lines)]) by numpydoc headers."""
    heads = [i for i in range(1, len(lines) - 1)
             if lines[i].strip() and len(lines[i + 1].strip()) >= 3 and set(lines[i + 1].strip()) == {"-"}]
    preamble = lines[: heads[0]] if heads else lines
    sections = [(lines[h].strip(), lines[h: nxt]) for h, nxt in zip(heads, [*heads[1:], len(lines)])]
    return preamble, sections


def _trim(lines: list[str]) -> list[str]:
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def _paragraphs(lines: list[str], budget: int) -> list[str]:
    """The leading whole paragraphs of ``lines`` that fit in ``budget`` characters (maybe none)."""
    cut = [i for i, line in enumerate(lines) if not line.strip()] + [len(lines)]
    fits = [i for i in cut if sum(len(x) + 1 for x in lines[:i]) <= budget]
    return _trim(lines[: max(fits)]) if fits else []


def _docstring(raw: list[str], indent: str, budget: int) -> str | None:
    """The docstring's source lines cut to ``budget`` characters by sections, closed again; None if nothing fits."""
    quote = raw[-1].rstrip()[-3:]
    if quote not in ('"""', "'''"):
        return None
    preamble, sections = _blocks([*raw[:-1], raw[-1].rstrip()[:-3]])
    used = len(indent) + 4  # the closing line
    kept = _paragraphs(_trim(preamble), budget - used)
    if not kept:
        return None
    used += sum(len(x) + 1 for x in kept)
    for title, lines in sections:
        size = sum(len(x) + 1 for x in _trim(lines)) + 1
        if title in KEEP_SECTIONS and used + size <= budget:
            kept += ["", *_trim(lines)]
            used += size
    return "\n".join(kept) + "\n" + indent + quote + "\n"


def _stub(lines: list[str], node: ast.FunctionDef, alias: tuple[str, str] | None) -> str | None:
    doc = node.body[0]
    if doc.lineno == node.lineno or doc.end_lineno is None:
        return None  # a one-line function: no header to complete apart from its docstring
    header = "\n".join(lines[node.lineno - 1: doc.lineno - 1]) + "\n"
    raw = lines[doc.lineno - 1: doc.end_lineno]
    indent = raw[0][: len(raw[0]) - len(raw[0].lstrip())]
    opening = alias[1] + "\n\n\n" if alias else ""
    text = _docstring(raw, indent, STUB_MAX_CHARS - len(opening) - len(header))
    if text is None:
        return None
    return (opening if alias and alias[0] in text else "") + header + text


def _public(rel: Path) -> bool:
    parts = rel.parts
    return not ({"tests", "testing"} & set(parts) or parts[-1] == "conftest.py"
                or any(p.startswith("_") and p != "__init__.py" for p in parts))


def _module(rel: Path) -> str:
    parts = list(rel.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def function_stubs(root: Path) -> list[tuple[str, str]]:
    """(``module.function``, stub) for every documented public top-level function under the package folder
    ``root``, in file-path then source order (a name defined twice in one module: its last definition)."""
    alias = IMPORTS.get(root.name)
    out: dict[str, str] = {}
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        rel = path.relative_to(root.parent)
        if not _public(rel):
            continue
        source = path.read_text(encoding="utf-8")
        with warnings.catch_warnings():  # old escape sequences in the package's strings are not our concern
            warnings.simplefilter("ignore")
            tree = ast.parse(source, str(rel))
        lines = source.splitlines()
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            if doc is None or len(doc) < MIN_DOC_CHARS:
                continue
            stub = _stub(lines, node, alias)
            if stub is not None:
                out[f"{_module(rel)}.{node.name}"] = stub
    return list(out.items())
