"""The hostile suite's workspace: a project root of its own with good inputs beside an output folder.

One workspace per test module (``ws``): EAGLEKB_ROOT and the working directory point at it, every task's
heavy work is stubbed (``helpers.hostile.stub_work``), and the checkout's committed baselines and drafters
are checked still there after the module. Sample sizes: ``helpers.hostile.examples`` (``EAGLEKB_HOSTILE_SCALE=10`` for a deeper local run).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from helpers.hostile import ROOT, stub_work, tree_state
from helpers.models import VOCAB, write_drafter, write_tiny_target

#: The checkout's data folders: no hostile run may delete a committed file there (every run works in a copy,
#: but a path that escapes its folder would reach them; the issue's story.record deleted the committed drafter).
GUARDED = ("baselines", "drafters")


def _tracked() -> list[str]:
    """The committed files under ``GUARDED`` that are there now (none outside a git checkout; large weights may
    be away on a GPU machine for a while, and their absence is not this suite's doing)."""
    out = subprocess.run(["git", "ls-files", "--", *GUARDED], cwd=ROOT, capture_output=True, text=True, check=False)
    return [f for f in out.stdout.splitlines() if (ROOT / f).is_file()] if out.returncode == 0 else []


@dataclass
class Workspace:
    root: Path  # EAGLEKB_ROOT and the working directory
    inputs: Path  # good input files the tasks read (never written)
    out: Path  # where outputs go

    def state(self) -> dict:
        """Everything but the output folder and the local history (the two places a task may write)."""
        return tree_state(self.root, skip=("out", ".eaglekb"))


def _inputs(folder: Path) -> None:
    from eaglekb.data.vocab import save_counts
    from eaglekb.formats.mapping import TokenCounts, build_mapping, save_mapping

    write_drafter(folder / "drafter")
    write_drafter(folder / "drafter2", selected=list(range(1, 81, 2)), seed=1)
    write_tiny_target(folder / "target")
    counts = TokenCounts(torch.arange(VOCAB, dtype=torch.int64) % 7)
    save_counts(folder / "counts.safetensors", counts)
    save_mapping(folder / "mapping.safetensors", build_mapping(counts, 40))
    (folder / "prompts.txt").write_text("what is two plus two?\nname a fruit.\n")
    (folder / "prompts.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")


@pytest.fixture(scope="session")
def _made_once(tmp_path_factory) -> Path:
    """The good inputs and baselines, made once per test run (tiny models take seconds); each module copies them."""
    base = tmp_path_factory.mktemp("hostile-inputs")
    for kind in ("plan", "bench", "probe"):
        shutil.copytree(ROOT / "baselines" / kind, base / "baselines" / kind)
    _inputs(base / "in")
    return base


@pytest.fixture(scope="module")
def ws(tmp_path_factory, _made_once) -> Workspace:
    before = _tracked()
    root = tmp_path_factory.mktemp("hostile")
    (root / "mkdocs.yml").write_text("site_name: hostile\n")
    shutil.copytree(_made_once / "baselines", root / "baselines")
    shutil.copytree(_made_once / "in", root / "in")
    (root / "out").mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EAGLEKB_ROOT", str(root))
        mp.delenv("EAGLEKB_DEBUG", raising=False)
        mp.delenv("OUT", raising=False)
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.chdir(root)
        with stub_work(mp):
            yield Workspace(root, root / "in", root / "out")
    lost = [f for f in before if not (ROOT / f).is_file()]
    assert not lost, f"committed files of the checkout disappeared during the hostile tests: {lost[:5]}"
