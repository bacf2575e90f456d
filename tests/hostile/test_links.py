"""Links on the way to an output (issue 44): one path rule for every write.

The rule (``eaglekb.io.files.guard_output`` through ``real_output``) judges the real path a write lands on,
every link of every parent followed: a parent that is a link into a checkout cannot carry --force onto a
tracked file (the issue's ``remap SRC MAP LINK/smollm2-135m-v1 --force`` replaced the committed weights), and
a link as the output itself, a link that leads nowhere and a loop of links are refused in one line, exit 2,
nothing changed. Each kind of link is tried against every task that writes (by kind, not by instance); a
link to a plain folder is followed, not refused.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from helpers.hostile import one_line_failure, run_cli, story_run, tree_state

DRAFTER = "smollm2-135m-default"  # the one drafter the story run below exported

#: Each task that writes: (argv with its output at PATH and a fresh number N, the option that names the output,
#: whether the output is a folder, whether the task takes --force). story.record writes DEST/NAME for each
#: exported drafter NAME: its PATH is DEST/smollm2-135m-default, and the user names DEST.
WRITERS = {
    "vocab.build": (lambda p, n: ["vocab.build", "--draft-vocab-size=8", "--counts=in/counts.safetensors",
                                  f"--out={p}"], "--out", False, True),
    "vocab.build --save-counts": (lambda p, n: ["vocab.build", "--draft-vocab-size=8", "--counts=in/counts.safetensors",
                                                f"--out=out/m{n}.safetensors", f"--save-counts={p}"],
                                  "--save-counts", False, True),
    "story.prompts": (lambda p, n: ["story.prompts", f"--out={p}"], "--out", False, True),
    "story.record --drafters": (lambda p, n: ["story.record", "RUN", f"hx{n}", "--drafters", str(p.parent)],
                                "--drafters", True, True),
    "remap": (lambda p, n: ["remap", "in/drafter", "in/mapping.safetensors", str(p)], "--out", True, True),
    "finetune": (lambda p, n: ["finetune", "--data=in", f"--out={p}"], "--out", True, False),
    "datagen": (lambda p, n: ["datagen", "--target=in/target", "--prompts-file=in/prompts.txt", f"--out={p}"],
                "--out", True, False),
    "story.run": (lambda p, n: ["story.run", "--tiny", f"--work=out/w{n}", f"--out={p}"], "--out", True, False),
    "story.run --work": (lambda p, n: ["story.run", "--tiny", f"--work={p}", f"--out=out/o{n}"], "--work", True, False),
    "story.export": (lambda p, n: ["story.export", "--names=a", f"--work=out/w{n}", f"--out={p}"], "--out", True, True),
    "remap.measure": (lambda p, n: ["remap.measure", "in/mapping.safetensors", "in/mapping.safetensors",
                                    f"--out={p}"], "--out", True, True),
    "models.random": (lambda p, n: ["models.random", str(p)], "--out", True, False),
    "docs.build": (lambda p, n: ["docs.build", f"--site-dir={p}"], "--site-dir", True, False),
}
_N = [0]


def _n() -> int:
    _N[0] += 1
    return _N[0]


def _leaf(name: str) -> str:
    folder = WRITERS[name][2]
    return DRAFTER if name.startswith("story.record") else ("out" if folder else "k25-investigation.json")


def _argv(ws, run: Path, name: str, path: Path, n: int, force: bool) -> list[str]:
    argv_for, _, _, takes_force = WRITERS[name]
    argv = [str(run) if a == "RUN" else a for a in argv_for(path, n)]
    return argv + (["--force"] if force and takes_force else [])


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A finished story run whose export holds one real tiny drafter (what story.record unpacks)."""
    folder = tmp_path_factory.mktemp("story-run") / "run"
    story_run(folder, DRAFTER)
    return folder


def _git_repo(folder: Path) -> Path:
    git = ["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(folder)], check=True, capture_output=True)
    subprocess.run([*git, "add", "-A"], check=True, capture_output=True)
    subprocess.run([*git, "commit", "-qm", "seed"], check=True, capture_output=True)
    return folder


def _checkout_with(ws, name: str, n: int) -> Path:
    """A checkout whose folder ``data`` tracks, at the writer's output name, what the writer itself would write
    (a drafter folder, a cited baseline): what --force replaced through a link before. Returns ``data``."""
    data = ws.out / f"checkout{n}" / "data"
    data.mkdir(parents=True)
    leaf = data / _leaf(name)
    if WRITERS[name][2]:
        shutil.copytree(ws.inputs / "drafter", leaf)
    else:
        shutil.copy(ws.root / "baselines" / "plan" / "k25-investigation.json", leaf)
    _git_repo(data.parent)
    return data


def _path_through(ws, name: str, kind: str, n: int) -> Path:
    """The output path the user types for each kind of link on the way (made here, under out/)."""
    leaf = _leaf(name)
    if kind == "a parent link into a checkout's tracked files":
        (ws.out / f"link{n}").symlink_to(_checkout_with(ws, name, n))
        return ws.out / f"link{n}" / leaf
    if kind.endswith("as parent"):
        parent = ws.out / f"p{n}"
        if kind.startswith("dangling"):
            parent.symlink_to(ws.out / f"nowhere{n}")
        else:
            parent.symlink_to(ws.out / f"q{n}")
            (ws.out / f"q{n}").symlink_to(parent)
        return parent / leaf
    folder = ws.out / f"t{n}"  # the link is the output itself, inside a real folder
    folder.mkdir()
    target = folder / leaf
    if kind == "a link as target":
        target.symlink_to(ws.inputs / "drafter" if WRITERS[name][2] else ws.inputs / "prompts.txt")
    elif kind == "a dangling link as target":
        target.symlink_to(folder / "nowhere")
    else:
        target.symlink_to(folder / "other")
        (folder / "other").symlink_to(target)
    return target


KINDS = ["a parent link into a checkout's tracked files", "a link as target", "a dangling link as target",
         "a dangling link as parent", "a link loop as target", "a link loop as parent"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", sorted(WRITERS))
def test_no_writer_writes_through_a_link_it_may_not(ws, run, name, kind):
    n = _n()
    path = _path_through(ws, name, kind, n)
    before = tree_state(ws.root, skip=(".eaglekb",))
    for force in (False, True):
        argv = _argv(ws, run, name, path, n, force)
        res = run_cli(argv)
        assert one_line_failure(res) is None, (argv, res)
        assert res.reached is None and res.code == 2, (argv, res)
        line = res.err_lines[0]
        assert WRITERS[name][1] in line, (argv, line)
        if kind.startswith("a parent link into"):
            assert "tracks" in line, (argv, line)
        else:
            assert "link" in line, (argv, line)
        assert tree_state(ws.root, skip=(".eaglekb",)) == before, (argv, "something changed")


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_parent_link_to_a_plain_folder_is_followed(ws, run, name):
    """Links are not banned: one to an ordinary folder is followed and the task gets to its work."""
    n = _n()
    real = ws.out / f"real{n}"
    real.mkdir()
    (ws.out / f"via{n}").symlink_to(real)
    path = ws.out / f"via{n}" / _leaf(name)
    argv = _argv(ws, run, name, path, n, False)
    res = run_cli(argv)
    assert one_line_failure(res) is None, (argv, res)
    # it gets past the output rule: to its work, to the end, or to a refusal that is not about the output
    assert res.reached or res.code == 0 or WRITERS[name][1] not in res.err, (argv, res)
    if res.code == 0 and not res.reached:
        assert (real / _leaf(name)).exists(), (argv, "the output is where the link leads")
