"""eaglekb.io.files and links: the output rule judges the real path (every parent link followed); writers never
write through a link (O_EXCL / O_NOFOLLOW creation, renames that replace a link rather than its target)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from eaglekb.io.errors import BadInput
from eaglekb.io.files import atomic_write_text, guard_output, output_lock, real_output, replace_folder, tracked_files


def _repo(folder: Path) -> Path:
    (folder / "drafters" / "v1").mkdir(parents=True)
    (folder / "drafters" / "v1" / "config.json").write_text("committed")
    (folder / "k25.json").write_text("cited")
    git = ["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(folder)], check=True, capture_output=True)
    subprocess.run([*git, "add", "-A"], check=True, capture_output=True)
    subprocess.run([*git, "commit", "-qm", "seed"], check=True, capture_output=True)
    return folder


def test_tracked_files_look_through_parent_links_but_judge_a_link_itself_as_the_link(tmp_path):
    repo = _repo(tmp_path / "repo")
    (tmp_path / "L").symlink_to(repo / "drafters")
    (tmp_path / "F").symlink_to(repo / "k25.json")
    assert tracked_files(tmp_path / "L" / "v1") == ["drafters/v1/config.json"]
    assert tracked_files(tmp_path / "F") == []  # the link is not tracked; guard_output refuses it as a link


@pytest.mark.parametrize("force", [False, True])
def test_guard_refuses_a_tracked_file_reached_through_a_parent_link(tmp_path, force):
    repo = _repo(tmp_path / "repo")
    (tmp_path / "L").symlink_to(repo / "drafters")
    (tmp_path / "B").symlink_to(repo)
    with pytest.raises(BadInput, match="tracks.*through a link"):
        guard_output(tmp_path / "L" / "v1", where="--out L/v1", folder=True, force=force, ours=lambda p: True)
    with pytest.raises(BadInput, match="tracks"):
        guard_output(tmp_path / "B" / "k25.json", where="--out B/k25.json", force=force)
    assert (repo / "k25.json").read_text() == "cited"
    assert guard_output(tmp_path / "L" / "v2", where="--out L/v2", folder=True) is False  # new: fine


@pytest.mark.parametrize("case, fragment", [
    ("dangling parent", "leads nowhere"), ("loop parent", "round in a loop"), ("dangling target", "through a link"),
    ("loop target", "through a link"), ("target", "through a link"), ("file as parent", "is a file"),
])
def test_real_output_refuses_links_that_lead_nowhere_loop_or_are_the_output(tmp_path, case, fragment):
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    (tmp_path / "file").write_text("x")
    (tmp_path / "to-file").symlink_to(tmp_path / "file")
    path = {"dangling parent": "dangling/x", "loop parent": "a/x", "dangling target": "dangling",
            "loop target": "a", "target": "to-file", "file as parent": "file/x"}[case]
    with pytest.raises(BadInput, match=fragment) as info:
        real_output(tmp_path / path, where=f"--out {path}")
    assert f"--out {path}" in info.value.line()
    assert not (tmp_path / "nowhere").exists() and (tmp_path / "file").read_text() == "x"


def test_real_output_follows_a_link_to_a_folder_and_a_relative_path(tmp_path, monkeypatch):
    (tmp_path / "real").mkdir()
    (tmp_path / "via").symlink_to(tmp_path / "real")
    monkeypatch.chdir(tmp_path)
    assert real_output("via/x", where="--out via/x") == (tmp_path / "real" / "x").resolve()
    assert real_output(tmp_path / "new" / "deeper", where="--out") == (tmp_path / "new" / "deeper").resolve()


def test_within_refuses_a_real_path_outside_the_folder_named(tmp_path):
    (tmp_path / "dest").mkdir()
    with pytest.raises(BadInput, match="outside the folder named"):
        guard_output(tmp_path / "dest" / ".." / "elsewhere", where="--drafters dest", folder=True,
                     within=tmp_path / "dest")
    assert guard_output(tmp_path / "dest" / "name", where="--drafters dest", folder=True,
                        within=tmp_path / "dest") is False


def test_writers_replace_a_link_never_write_through_it(tmp_path):
    (tmp_path / "precious").write_text("keep")
    (tmp_path / "out.json").symlink_to(tmp_path / "precious")
    atomic_write_text(tmp_path / "out.json", "new")
    assert (tmp_path / "precious").read_text() == "keep"
    assert not (tmp_path / "out.json").is_symlink() and (tmp_path / "out.json").read_text() == "new"
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "config.json").write_text("keep")
    (tmp_path / "dest").symlink_to(tmp_path / "kept")
    (tmp_path / "new").mkdir()
    with pytest.raises(BadInput, match="through a link"):
        replace_folder(tmp_path / "new", tmp_path / "dest")
    assert (tmp_path / "kept" / "config.json").read_text() == "keep" and (tmp_path / "dest").is_symlink()


def test_a_lock_planted_as_a_link_is_never_written_through(tmp_path):
    (tmp_path / "precious").write_text("keep")
    (tmp_path / ".run.lock").symlink_to(tmp_path / "precious")
    with pytest.raises(BadInput, match="another run is writing this output"):
        with output_lock(tmp_path / "run", where="--out run"):
            pass
    assert (tmp_path / "precious").read_text() == "keep" and (tmp_path / ".run.lock").is_symlink()
