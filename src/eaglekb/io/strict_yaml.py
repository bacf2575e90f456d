"""YAML a person wrote by hand, read strictly: ``yaml.safe_load`` plus the two things it lets through.

Owns ``load``: a duplicate key in a mapping is refused (``safe_load`` keeps the last one silently, so a recipe
that names ``datagen`` twice would run once with the second step's options), and so is a document whose aliases
expand to more than ``MAX_NODES`` nodes (an alias "bomb": nine levels of ten aliases each read in an instant
but are a billion values to any code that walks them). Tags stay ``safe_load``'s: no Python objects. Each
refusal is one ``BadInput`` line naming the file and line. Knows nothing about recipes or the task runner.
"""

from __future__ import annotations

from typing import Any

import yaml

from eaglekb.io.errors import BadInput

#: The most nodes a document may expand to, aliases counted each time they are used.
MAX_NODES = 100_000


class _Refused(Exception):
    def __init__(self, what: str, line: int | None, found: str) -> None:
        super().__init__(what)
        self.what, self.line, self.found = what, line, found


class _StrictLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                if key in seen:
                    raise _Refused("duplicate key", key_node.start_mark.line + 1,
                                   f"{str(key)[:60]!r} also on line {seen[key]}")
                seen[key] = key_node.start_mark.line + 1
            except TypeError:  # an unhashable key: safe_load's own error follows
                break
        return super().construct_mapping(node, deep=deep)


def _expanded_size(root: yaml.Node) -> int:
    """Nodes the document expands to, an alias counted each time it is used (memoised: linear in the file)."""
    sizes: dict[int, int] = {}

    def size(node: yaml.Node, depth: int = 0) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if depth > 500:
            raise RecursionError
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child, depth + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k, depth + 1) + size(v, depth + 1) for k, v in node.value)
        sizes[id(node)] = min(total, MAX_NODES + 1)
        return sizes[id(node)]

    return size(root)


def load(text: str, *, where: str, expected: str) -> Any:
    """The single YAML document in ``text``; one line naming ``where`` (and the line) when it is not one."""
    try:
        loader = _StrictLoader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            if _expanded_size(node) > MAX_NODES:
                raise _Refused("document too large once its aliases are expanded", None,
                               f"more than {MAX_NODES:,} values")
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except _Refused as exc:
        at = f"{where}:{exc.line}" if exc.line else where
        raise BadInput(exc.what, where=at, expected=expected, found=exc.found) from None
    except RecursionError:
        raise BadInput("YAML nested too deeply", where=where, expected=expected + ", nested at most 500 levels",
                       found="deeper") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"{where}:{mark.line + 1}" if mark is not None else where
        raise BadInput("not valid YAML", where=at, expected=expected,
                       found=str(getattr(exc, "problem", None) or exc).splitlines()[0][:80]) from None
