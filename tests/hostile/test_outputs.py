"""The one rule for every write (issue 26): a command replaces only what it created in this run, or a path the
user named together with --force, never a tracked file of the repository and never one of its inputs; a
folder is replaced by writing the new one beside it and renaming, the old copy kept until the new one is in
place; two runs writing one output at once are refused (a lock), not merged.

The rule is ``eaglekb.io.files`` (``guard_output``, ``output_lock``, ``replace_folder``) and every writer's
task calls it through ``runbooks._common.claim``; the property test drives every writer with an output path
that already holds something it did not write, and checks that nothing there changed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.hostile import refused as _refused, drafter_files, examples, one_line_failure, run_cli, story_run, tree_state




def _git_repo(folder: Path, files: dict[str, str]) -> Path:
    """A git work tree at FOLDER with FILES committed (author given on the command line: no identity needed)."""
    folder.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    git = ["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(folder)], check=True, capture_output=True)
    subprocess.run([*git, "add", "-A"], check=True, capture_output=True)
    subprocess.run([*git, "commit", "-qm", "seed"], check=True, capture_output=True)
    return folder


# --------------------------------------------------------------------------- the helpers themselves


def test_guard_refuses_links_inputs_tracked_files_and_other_kinds(tmp_path):
    from eaglekb.io.errors import BadInput
    from eaglekb.io.files import guard_output

    repo = _git_repo(tmp_path / "repo", {"kept.txt": "tracked", "data/a.json": "{}"})
    (tmp_path / "plain.txt").write_text("mine")
    (tmp_path / "link").symlink_to(tmp_path / "plain.txt")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "n.txt").write_text("x")
    cases = [
        (dict(path=tmp_path / "link"), "through a link"),
        (dict(path=tmp_path / "plain.txt", inputs=[tmp_path / "plain.txt"]), "input of this command"),
        (dict(path=tmp_path / "in", folder=True, inputs=[tmp_path / "in" / "x.safetensors"]), "input"),
        (dict(path=repo / "kept.txt", force=True), "the repository tracks"),
        (dict(path=repo / "data", folder=True, force=True, ours=lambda p: True), "the repository tracks"),
        (dict(path=tmp_path / "plain.txt"), "already exists"),
        (dict(path=tmp_path / "plain.txt", folder=True), "is a file"),
        (dict(path=tmp_path / "notes", folder=True, force=True, ours=lambda p: False), "replaces only"),
        (dict(path=tmp_path / "notes", folder=True, reuse=True, ours=lambda p: False), "already exists"),
    ]
    for kw, fragment in cases:
        with pytest.raises(BadInput, match=fragment):
            guard_output(where="--out", **kw)
    assert guard_output(tmp_path / "new.txt", where="--out") is False
    assert guard_output(tmp_path / "empty", where="--out", folder=True) is False
    assert guard_output(tmp_path / "plain.txt", where="--out", force=True) is True
    assert guard_output(tmp_path / "notes", where="--out", folder=True, reuse=True, ours=lambda p: True) is True
    assert (repo / "kept.txt").read_text() == "tracked" and (tmp_path / "plain.txt").read_text() == "mine"


def test_a_second_writer_is_refused_and_a_dead_writers_lock_is_taken_over(tmp_path):
    from eaglekb.io.errors import BadInput
    from eaglekb.io.files import output_lock

    out = tmp_path / "run"
    with output_lock(out, where="--out run") as lock:
        assert lock.is_file()
        with pytest.raises(BadInput, match="another run is writing this output"):
            with output_lock(out, where="--out run"):
                pass
    assert not lock.exists(), "the lock outlived its run"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        import socket

        lock.write_text(f"{socket.gethostname()}\n{sleeper.pid}\n2026-01-01T00:00:00Z\n")
        with pytest.raises(BadInput, match=f"process {sleeper.pid}"):
            with output_lock(out, where="--out run"):
                pass
    finally:
        sleeper.kill()
        sleeper.wait()
    with output_lock(out, where="--out run"):  # its process is gone: the stale lock is taken over
        pass
    assert not lock.exists()


@pytest.mark.parametrize("exchange", [True, False])
def test_replace_folder_keeps_the_old_copy_until_the_new_one_is_in_place(tmp_path, monkeypatch, exchange):
    from eaglekb.io import files

    dest, new = tmp_path / "drafter", tmp_path / ".drafter.new"
    for folder, text in ((dest, "old"), (new, "new")):
        folder.mkdir()
        (folder / "config.json").write_text(text)
    if not exchange:
        monkeypatch.setattr(files, "_exchange", lambda a, b: False)
        calls = []
        real = os.replace

        def killed_at_second_rename(a, b):  # a kill between moving the old copy aside and the new one in
            calls.append((a, b))
            if len(calls) == 2:
                raise KeyboardInterrupt
            return real(a, b)

        monkeypatch.setattr(files.os, "replace", killed_at_second_rename)
        with pytest.raises(KeyboardInterrupt):
            files.replace_folder(new, dest)
        assert (dest / "config.json").read_text() == "old", "the old copy is back in place"
        monkeypatch.setattr(files.os, "replace", real)
    files.replace_folder(new, dest)
    assert (dest / "config.json").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["drafter"], "no copy left behind"


# --------------------------------------------------------------------------- every writer, through the CLI


#: Each writer: how to call it with its output at PATH (and a fresh number N), and whether the output is a folder.
WRITERS = {
    "vocab.build": (lambda p, n: ["vocab.build", "--draft-vocab-size=8", "--counts=in/counts.safetensors",
                                  f"--out={p}"], "--out", False),
    "vocab.build --save-counts": (lambda p, n: ["vocab.build", "--draft-vocab-size=8", "--counts=in/counts.safetensors",
                                                f"--out=out/m{n}.safetensors", f"--save-counts={p}"],
                                  "--save-counts", False),
    "story.prompts": (lambda p, n: ["story.prompts", f"--out={p}"], "--out", False),
    "remap": (lambda p, n: ["remap", "in/drafter", "in/mapping.safetensors", str(p)], "--out", True),
    "finetune": (lambda p, n: ["finetune", "--data=in", f"--out={p}"], "--out", True),
    "datagen": (lambda p, n: ["datagen", "--target=in/target", "--prompts-file=in/prompts.txt", f"--out={p}"],
                "--out", True),
    "story.run": (lambda p, n: ["story.run", "--tiny", f"--work=out/w{n}", f"--out={p}"], "--out", True),
    "story.run --work": (lambda p, n: ["story.run", "--tiny", f"--work={p}", f"--out=out/o{n}"], "--work", True),
    "story.export": (lambda p, n: ["story.export", "--names=a", f"--work=out/w{n}", f"--out={p}"], "--out", True),
    "remap.measure": (lambda p, n: ["remap.measure", "in/mapping.safetensors", "in/mapping.safetensors",
                                    f"--out={p}"], "--out", True),
    "models.random": (lambda p, n: ["models.random", str(p)], "--out", True),
    "docs.build": (lambda p, n: ["docs.build", f"--site-dir={p}"], "--site-dir", True),
}
CONTENT = st.sampled_from(["a file", "a folder of notes", "a tracked file", "a link"])
_N = [0]


def _existing(ws, kind: str, n: int) -> Path:
    """A path under out/ that already holds something no writer wrote: a file, a folder, a tracked file, a link."""
    base = ws.out / f"x{n}"
    if kind == "a file":
        base.write_text("not yours")
    elif kind == "a folder of notes":
        base.mkdir()
        (base / "notes.txt").write_text("not yours")
    elif kind == "a link":
        base.symlink_to(ws.inputs)
    else:
        return _git_repo(ws.out / f"repo{n}", {"kept.txt": "tracked"}) / ("kept.txt" if n % 2 else "")
    return base


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_no_writer_replaces_what_it_did_not_write(ws, name):
    argv_for, option, folder = WRITERS[name]

    @examples(4)
    @given(CONTENT, st.booleans())
    def check(kind, force):
        _N[0] += 1
        path = _existing(ws, kind, _N[0])
        before = tree_state(ws.root, skip=(".eaglekb",))
        argv = argv_for(path, _N[0]) + (["--force"] if force and name not in ("models.random", "docs.build") else [])
        res = run_cli(argv)
        assert one_line_failure(res) is None, (argv, res)
        if force and kind == "a file" and not folder:  # an untracked file the user named with --force: replaced
            assert res.reached or res.code == 0, (argv, res)
            outside = lambda state: {k: v for k, v in state.items() if not k.startswith("out")}  # noqa: E731
            assert outside(tree_state(ws.root, skip=(".eaglekb",))) == outside(before), argv
            return
        assert res.reached is None and res.code == 2, (argv, res)
        assert option in res.err_lines[0], (argv, res.err)
        assert tree_state(ws.root, skip=(".eaglekb",)) == before, argv

    check()


def test_story_record_never_replaces_a_tracked_folder_or_one_that_is_not_a_drafter(ws, tmp_path):
    run = tmp_path / "run"
    story_run(run, "smollm2-135m-default")
    repo = _git_repo(tmp_path / "repo", {"drafters/smollm2-135m-default/config.json": "{\"committed\": 1}"})
    for extra in ([], ["--force"], ["--dry-run"], ["--dry-run", "--force"]):
        _refused(run_cli(["story.record", str(run), "hx", "--drafters", str(repo / "drafters"), *extra]),
                 "--drafters", "tracks")
    assert (repo / "drafters/smollm2-135m-default/config.json").read_text() == "{\"committed\": 1}"
    notes = tmp_path / "baselines"
    (notes / "smollm2-135m-default").mkdir(parents=True)
    (notes / "smollm2-135m-default" / "plan.json").write_text("recorded")
    _refused(run_cli(["story.record", str(run), "hx", "--drafters", str(notes)]), "already exists")
    _refused(run_cli(["story.record", str(run), "hx", "--drafters", str(notes), "--force"]), "replaces only a drafter")
    assert (notes / "smollm2-135m-default" / "plan.json").read_text() == "recorded"
    dest = tmp_path / "dest"
    assert run_cli(["story.record", str(run), "hx", "--drafters", str(dest)]).code == 0
    _refused(run_cli(["story.record", str(run), "hx", "--drafters", str(dest)]), "already exists", "--force")
    assert run_cli(["story.record", str(run), "hx", "--drafters", str(dest), "--force"]).code == 0
    assert (dest / "smollm2-135m-default" / "config.json").read_bytes() == drafter_files()["config.json"]
    assert sorted(p.name for p in dest.iterdir()) == ["smollm2-135m-default"], "no staging copy left"


@pytest.mark.parametrize("case, fragment", [("config only", "not a drafter"), ("bad config", "not a drafter"),
                                            ("weights only", "not a drafter"), ("a pickle too", "no pickle")])
def test_story_record_checks_that_the_files_are_a_drafter_before_writing(ws, tmp_path, case, fragment):
    real = drafter_files()
    files = {"config only": {"config.json": real["config.json"]},
             "bad config": {"config.json": b"not json", "model.safetensors": real["model.safetensors"]},
             "weights only": {"model.safetensors": real["model.safetensors"]},
             "a pickle too": {**real, "pytorch_model.bin": b"\x80\x04K\x01."}}[case]
    run = tmp_path / "run"
    story_run(run, "b-remap", files=files)
    for extra in ([], ["--dry-run"]):
        _refused(run_cli(["story.record", str(run), "hx", "--drafters", str(tmp_path / "d"), *extra]), fragment)
    assert not (tmp_path / "d" / "b-remap").exists()


def test_finetune_refuses_a_second_run_into_the_same_out(ws, tmp_path):
    import socket

    out = ws.out / "run-locked"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (ws.out / ".run-locked.lock").write_text(f"{socket.gethostname()}\n{sleeper.pid}\n2026-01-01T00:00:00Z\n")
        for task in (["finetune", "--data=in", f"--out={out}"],
                     ["datagen", "--target=in/target", "--prompts-file=in/prompts.txt", f"--out={out}"]):
            _refused(run_cli(task), "another run is writing this output", "--out")
    finally:
        sleeper.kill()
        sleeper.wait()
        (ws.out / ".run-locked.lock").unlink(missing_ok=True)
    res = run_cli(["finetune", "--data=in", f"--out={out}"])  # free again: it gets to the training
    assert res.reached == "eaglekb.training.train", res
    assert not (ws.out / ".run-locked.lock").exists(), "the lock outlived the run"


def test_remap_force_keeps_the_old_drafter_until_the_new_one_is_in_place(ws, monkeypatch):
    from eaglekb.io import files

    out = ws.out / "remapped-kill"
    assert run_cli(["remap", "in/drafter", "in/mapping.safetensors", str(out)]).code == 0
    before = (out / "model.safetensors").read_bytes()
    monkeypatch.setattr(files, "_exchange", lambda a, b: False)
    real, calls = os.replace, []

    def killed(a, b):
        calls.append(b)
        if Path(b) == out and len([c for c in calls if Path(c) == out]) == 1:  # the new drafter's rename: killed
            raise KeyboardInterrupt
        return real(a, b)

    monkeypatch.setattr(files.os, "replace", killed)
    res = run_cli(["remap", "in/drafter2", "in/mapping.safetensors", str(out), "--force"])
    assert res.code == 130, res
    assert (out / "model.safetensors").read_bytes() == before, "the old drafter is still there"
    monkeypatch.setattr(files.os, "replace", real)
    assert run_cli(["remap", "in/drafter2", "in/mapping.safetensors", str(out), "--force"]).code == 0
    assert (out / "model.safetensors").read_bytes() != before
    assert not [p for p in ws.out.iterdir() if p.name.startswith(".remapped-kill")], "no staging copy left"


# --------------------------------------------------------------------------- docs.deploy


def test_docs_deploy_refuses_the_checked_out_branch_mikes_names_and_no_identity(ws, tmp_path, monkeypatch):
    from runbooks import docs

    repo = _git_repo(tmp_path / "site-repo", {"mkdocs.yml": "site_name: x\nstrict: true\n", "docs/index.md": "x"})
    subprocess.run(["git", "-C", str(repo), "branch", "notes"], check=True, capture_output=True)
    monkeypatch.setattr(docs, "ROOT", repo)
    _refused(run_cli(["docs.deploy", "0.1", "--branch=main"]), "--branch", "checked out")
    _refused(run_cli(["docs.deploy", "0.1", "--branch=notes"]), "--branch", "not a docs branch")
    for version, option in (("versions.json", "VERSION"), ("index.html", "VERSION"), ("404.html", "VERSION")):
        _refused(run_cli(["docs.deploy", version]), option, "collides")
    _refused(run_cli(["docs.deploy", "0.1", "--alias=versions.json"]), "--alias", "collides")
    real = docs._git

    def no_identity(*args):
        if args[:1] == ("var",):
            return subprocess.CompletedProcess(args, 128, "", "*** Please tell me who you are.\n\nfatal: unable to "
                                               "auto-detect email address (got 'root@vm.(none)')\n")
        return real(*args)

    monkeypatch.setattr(docs, "_git", no_identity)
    line = _refused(run_cli(["docs.deploy", "0.1"]), "no identity", "fatal: unable to auto-detect email address")
    assert "git config user.email" in line
    branches = subprocess.run(["git", "-C", str(repo), "branch"], capture_output=True, text=True).stdout
    assert "gh-pages" not in branches, "nothing was deployed"


def test_mikes_own_failure_line_is_git_or_mkdocs_not_a_librarys_log_line():
    from runbooks.docs import _first_error

    kernel = "[W 2026-01-01 00:00:00 kernel] WARNING: TCP port in use, retrying with another"
    assert _first_error(f"{kernel}\nfatal: unable to auto-detect email address\nerror: Command failed") == \
        "fatal: unable to auto-detect email address"
    assert _first_error(f"{kernel}\nWARNING -  Doc file 'plan.md' contains a link 'x.md'\nerror: Command failed") \
        == "WARNING -  Doc file 'plan.md' contains a link 'x.md'"
    assert _first_error(f"{kernel}\nerror: Command '['mkdocs']' returned non-zero exit status 1.").startswith("error:")


def test_docs_build_never_empties_a_folder_that_is_not_a_site(ws, tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "keep.md").write_text("mine")
    _refused(run_cli(["docs.build", f"--site-dir={notes}"]), "--site-dir", "already exists")
    for folder in ("docs", "baselines", "."):
        _refused(run_cli(["docs.build", f"--site-dir={folder}"]), "--site-dir")
    assert (notes / "keep.md").read_text() == "mine"
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<html>")
    (site / "sitemap.xml").write_text("<urlset/>")
    assert run_cli(["docs.build", f"--site-dir={site}"]).reached == "runbooks.docs._strict_build"


# --------------------------------------------------------------------------- the CI gate and oversized baselines


def _oversized_repo(tmp_path, ws) -> Path:
    import json

    good = json.loads((ws.root / "baselines/plan/k25-investigation.json").read_text())
    good["name"] = "big"
    repo = _git_repo(tmp_path / "kb", {"mkdocs.yml": "site_name: x\n",
                                       "baselines/plan/big.json": json.dumps(good, indent=2, sort_keys=True) + "\n"})
    good["summary"] = "x" * (5 << 20)  # past the 4 MiB limit
    (repo / "baselines/plan/big.json").write_text(json.dumps(good, indent=2, sort_keys=True) + "\n")
    return repo


def test_a_baseline_past_the_size_limit_fails_the_gate(ws, tmp_path, monkeypatch):
    repo = _oversized_repo(tmp_path, ws)
    monkeypatch.setenv("EAGLEKB_ROOT", str(repo))
    res = run_cli(["baselines.diff", "--rev-a=HEAD", "--fail-on=change"])
    assert res.code == 1 and "Traceback" not in res.err, res
    assert run_cli(["baselines.check"]).code == 1


def test_a_committed_baseline_past_the_size_limit_fails_the_gate(ws, tmp_path, monkeypatch):
    repo = _oversized_repo(tmp_path, ws)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "commit", "-qam", "grow"], check=True, capture_output=True)
    monkeypatch.setenv("EAGLEKB_ROOT", str(repo))
    res = run_cli(["baselines.diff", "--rev-a=HEAD~1", "--rev-b=HEAD", "--fail-on=change"])
    assert res.code == 1, res
