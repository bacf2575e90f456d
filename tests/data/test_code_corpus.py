"""``py-functions``: networkx's documented public functions as HumanEval-shaped stubs, read with ``ast`` from the
pinned package's source (never imported), split 1 in 20 per function, disjoint from every evaluation set."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

from eaglekb.data import corpora, pystubs
from eaglekb.data.prompts import item_key, training_prompts
from eaglekb.io.errors import IntegrityError, MissingFile

NAME = "py-functions"
#: (split, items, prompts at the default one variant, sha256): pinned, like the other corpora's pins.
PINS = [
    ("train", 951, 951, "eb25fd36012000d98cf33231316e65d71a1c60326652c4b4673ba5a9151b60e6"),
    ("eval", 50, 50, "60325142f992c537c5946ed5275c00e048f78e5f71f3bd45c9c71781dc1ce8e8"),
]
HEADER = re.compile(r"^def \w+\(.*?\)[^:\n]*:$", re.M | re.S)


def _item(prompt_id: str) -> str:
    return prompt_id.split(":", 1)[1].rsplit("#", 1)[0]


@pytest.mark.parametrize("split,items,count,sha", PINS)
def test_counts_and_hash_are_stable(split, items, count, sha):
    ps = corpora.load(NAME, split=split)
    assert (ps.manifest["items"], len(ps), ps.manifest["sha256"]) == (items, count, sha)
    assert {k: ps.manifest[k] for k in ("package", "version", "license", "variants")} == {
        "package": "networkx", "version": "3.6.1", "license": "BSD-3-Clause", "variants": 1}
    assert corpora.SOURCES[NAME].max_variants == len(pystubs.STUB_TEMPLATES) and NAME in corpora.TRAINING_CORPORA


def test_ids_are_unique_module_paths_of_public_functions():
    every = corpora.load(NAME, split="all", variants=0)
    assert len({p.id for p in every.prompts}) == len(every) == 1001 * len(pystubs.STUB_TEMPLATES)
    keys = [_item(p.id) for p in corpora.load(NAME, split="all").prompts]
    assert len(set(keys)) == len(keys) > 500  # one prompt per function at the default variants
    assert all(k.startswith("networkx.") for k in keys)
    names = [k.split(".") for k in keys]
    assert not [k for k, parts in zip(keys, names) if {"tests", "testing", "conftest"} & set(parts)
                or any(p.startswith("_") for p in parts)]
    key = "networkx.algorithms.cycles.find_cycle"
    assert item_key(f"{NAME}:{key}#4") == f"{NAME}:{key}"  # --slice deals every variant of a function together


def test_prompts_are_humaneval_shaped_and_short():
    every = corpora.load(NAME, split="all", variants=0)
    for p in every.prompts:
        assert len(p.messages) == 1 and p.messages[0]["role"] == "user", p.id
        assert "```python\n" in p.text and "\ndef " in p.text and len(p.text) < 1500, p.id
        code = p.text.split("```python\n", 1)[1].split("```", 1)[0]
        assert code.rstrip().endswith(('"""', "'''")) and code.count('"""') + code.count("'''") >= 2, p.id
        assert not re.search(r"^@", code, re.M) and "\n    References\n" not in code, p.id
    used = {int(p.id.rsplit("#", 1)[1]) for p in corpora.load(NAME, split="all").prompts}
    assert used == set(range(len(pystubs.STUB_TEMPLATES)))  # every wrapper is some function's first


def test_a_stub_is_header_and_docstring_cut_by_sections():
    stubs = dict(pystubs.function_stubs(corpora.data_path(corpora.SOURCES[NAME]).parent))
    stub = stubs["networkx.algorithms.cycles.find_cycle"]
    assert stub.startswith('def find_cycle(G, source=None, orientation=None):\n    """Returns a cycle found via')
    assert "    Parameters\n    ----------\n" in stub and stub.endswith('\n    """\n') and "See Also" not in stub
    uses_nx = stubs["networkx.algorithms.lowest_common_ancestors.lowest_common_ancestor"]
    assert uses_nx.startswith("import networkx as nx\n\n\ndef lowest_common_ancestor(") and ">>> G = nx." in uses_nx


def test_the_reader_on_a_small_package(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "tests").mkdir(parents=True)
    long = "\n".join(f"    word {i} of a long explanation." for i in range(80))
    (pkg / "__init__.py").write_text(
        "import os\n\n\n@decorator\ndef public(a, b=1):\n    \"\"\"Add a and b and return the sum of both numbers.\n\n"
        "    Parameters\n    ----------\n    a : int\n\n    See Also\n    --------\n    other\n    \"\"\"\n"
        "    return a + b\n\n\n"
        "def _private(x):\n    \"\"\"A private helper that is documented at length, still private.\"\"\"\n\n\n"
        "def short(x):\n    \"\"\"Short.\"\"\"\n\n\n"
        f"def huge(x):\n    \"\"\"{'A very long summary line. ' * 80}\n    \"\"\"\n\n\n"
        f"def cut(x):\n    \"\"\"Returns x, explained in one opening paragraph of words.\n\n{long}\n    \"\"\"\n")
    (pkg / "tests" / "test_x.py").write_text('def test_a():\n    """A documented test that is never a prompt."""\n')
    (pkg / "_impl.py").write_text('def hidden(x):\n    """A public name in a private module, never a prompt."""\n')
    stubs = dict(pystubs.function_stubs(pkg))
    assert list(stubs) == ["pkg.public", "pkg.cut"]
    assert stubs["pkg.public"] == ('def public(a, b=1):\n    """Add a and b and return the sum of both numbers.\n\n'
                                   '    Parameters\n    ----------\n    a : int\n    """\n')
    assert stubs["pkg.cut"] == 'def cut(x):\n    """Returns x, explained in one opening paragraph of words.\n    """\n'


def test_held_out_functions_never_reach_training():
    train, held = (corpora.load(NAME, split=s, variants=0) for s in ("train", "eval"))
    assert not {_item(p.id) for p in train.prompts} & {_item(p.id) for p in held.prompts}
    stub = lambda p: corpora.normalise(p.text.split("```python\n", 1)[1].split("```", 1)[0])  # noqa: E731
    assert not {stub(p) for p in train.prompts} & {stub(p) for p in held.prompts}
    corpora.check_disjoint(train, held, *(corpora.load(n, split="eval") for n in corpora.EVAL_SETS))


def test_disjoint_from_humaneval_and_every_eval_set_through_the_training_path():
    ps = training_prompts([f"{NAME}:0"], per_source=0)
    assert len(ps) == 951 * len(pystubs.STUB_TEMPLATES)
    assert ps.manifest["eval_sets_excluded"] == list(corpora.EVAL_SETS) and f"{NAME}-eval" in ps.manifest[
        "eval_splits_excluded"]
    humaneval = {h for p in corpora.load("humaneval", split="eval").prompts for h in HEADER.findall(p.text)}
    ours = {h for p in ps.prompts for h in HEADER.findall(p.text)}
    assert len(humaneval) > 150 and not humaneval & ours  # no HumanEval signature is a training stub


def test_a_wrong_installed_version_is_one_line_with_the_fix(monkeypatch):
    real = corpora.metadata.distribution
    monkeypatch.setattr(corpora.metadata, "distribution",
                        lambda name: SimpleNamespace(version="3.5", locate_file=real(name).locate_file)
                        if name == "networkx" else real(name))
    with pytest.raises(IntegrityError) as err:
        corpora.load(NAME)
    line = err.value.line()
    assert "\n" not in line and "expected 3.6.1; found 3.5" in line
    assert "fix: python3 -m pip install --no-deps networkx==3.6.1" in line and f"corpus {NAME!r}" in line


def test_a_missing_package_is_one_line(monkeypatch):
    def missing(name):
        raise corpora.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(corpora.metadata, "distribution", missing)
    with pytest.raises(MissingFile, match="corpus package networkx is not installed"):
        corpora.load(NAME)


_NO_IMPORT = """
import json, sys

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "networkx":
            raise ImportError("networkx imported while reading its source")

sys.meta_path.insert(0, Refuse())
from eaglekb.data import corpora
ps = corpora.load("py-functions", split="all")
print(json.dumps({"count": len(ps), "imported": sorted(m for m in sys.modules if m.split(".")[0] == "networkx")}))
"""


def test_reading_never_imports_the_package():
    out = subprocess.run([sys.executable, "-c", _NO_IMPORT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"count": 1001, "imported": []}
