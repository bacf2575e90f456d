"""eaglekb.measure.command: the recorded command as a user types it, and what another machine cannot resolve."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from eaglekb.measure.command import NO_COMPARE, reproduce_command, typed_command, unportable_paths, writes_baselines
from eaglekb.models import sources

SITE = "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/invoke/__main__.py"


@pytest.fixture
def repo(tmp_path):
    (tmp_path / "drafters/d").mkdir(parents=True)
    (tmp_path / "sub").mkdir()
    return tmp_path


@pytest.mark.parametrize("arg0", [SITE, "/usr/local/bin/invoke", "inv", "invoke", "C:\\py\\Lib\\invoke\\__main__.py"])
def test_invoke_entry_points_are_written_invoke(repo, arg0):
    assert typed_command([arg0, "plan", "--steps", "2"], root=repo, cwd=repo) == "invoke plan --steps 2"


def test_repo_paths_relative_and_quoting(repo):
    argv = [SITE, "probe", "--drafter", str(repo / "drafters/d"), f"--out={repo}/sub/x", "--sweep", "1,1;2,1"]
    assert typed_command(argv, root=repo, cwd=repo) == "invoke probe --drafter drafters/d --out=sub/x --sweep '1,1;2,1'"


def test_relative_path_typed_in_a_subfolder_is_made_relative_to_the_root(repo):
    assert typed_command(["invoke", "inspect", "../drafters/d"], root=repo, cwd=repo / "sub") == \
        "invoke inspect drafters/d"


def test_embedded_model_cache_folder_becomes_its_name(repo, monkeypatch, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("EAGLEKB_CACHE", str(cache))
    folder = sources.model_dir("smollm2-135m")
    folder.mkdir(parents=True)
    argv = ["invoke", "story.run", "--model", str(folder), "--prompts", str(repo / "p.jsonl")]
    assert typed_command(argv, root=repo, cwd=repo) == "invoke story.run --model smollm2-135m --prompts p.jsonl"


@pytest.mark.parametrize("home", ["/tmp/fresh-home", "/root", "/home/user"])
def test_unportable_paths_are_flagged(monkeypatch, home):
    monkeypatch.setenv("HOME", home)  # a fresh clone's empty HOME under /tmp must not change the verdicts
    assert unportable_paths("invoke probe --drafter drafters/d --prompts builtin") == []
    found = unportable_paths("invoke bench --drafter /tmp/eaglekb-story2/run-b/drafter --out=/data/x --prompts ~/p.txt")
    assert len(found) == 3
    assert found[0].startswith("/tmp/eaglekb-story2/run-b/drafter: a temporary path")
    assert found[1].startswith("/data/x: an absolute path outside the repository")
    assert found[2].startswith("~/p.txt: an absolute path outside the repository")


def test_runbook_command_line_uses_it(monkeypatch, repo):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from runbooks._common import command_line

    monkeypatch.setenv("EAGLEKB_ROOT", str(repo))
    monkeypatch.setattr(sys, "argv", [SITE, "vocab.build", "--out", str(repo / "sub/v.safetensors")])
    assert command_line() == "invoke vocab.build --out sub/v.safetensors"


@pytest.mark.parametrize("command, expected", [
    ("invoke probe --device cuda --force --prompts builtin --record h200-x",
     "invoke probe --device cuda --prompts builtin --compare h200-x"),
    ("invoke bench --sweep '1,1;2,1' --record=cpu-a --force", "invoke bench --sweep '1,1;2,1' --compare cpu-a"),
    ("invoke plan --steps 2 --compare k25", "invoke plan --steps 2 --compare k25"),
    ("invoke models.prepare smollm2-135m --force --record smollm2-135m-prepare", "invoke models.prepare smollm2-135m"),
    ("invoke story.run --model smollm2-135m --no-export", "invoke story.run --model smollm2-135m --no-export"),
    ("pytest", "pytest"),
])
def test_reproduce_command_compares_and_overwrites_nothing(command, expected):
    got = reproduce_command(command)
    assert got == expected and writes_baselines(got) == []


def test_tasks_without_compare_are_the_ones_listed():
    """NO_COMPARE names exactly the recording tasks that take no --compare (checked against their signatures)."""
    import inspect

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import tasks

    found = []

    def walk(coll, prefix):
        for name, t in coll.tasks.items():
            params = inspect.signature(t.body).parameters
            if "record" in params and "compare" not in params:
                found.append(f"{prefix}{name}".replace("_", "-"))
        for cname, sub in coll.collections.items():
            walk(sub, f"{prefix}{cname}.")

    walk(tasks.ns, "")
    assert sorted(found) == sorted(NO_COMPARE)
