"""Identity by content: the sha256 of every input a result's config names, required by schema v2, and the
backfill of older files from git history (``invoke baselines.identity``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from eaglekb.io.errors import SchemaError
from eaglekb.io.pieces import sha256_files
from eaglekb.kb import baselines as bl
from eaglekb.kb import identity
from eaglekb.measure import provenance as prov
from eaglekb.models import sources
from helpers.kb import assert_edit_refused
from helpers.site import git_env

NOISE = {"repeats": 1, "spread_kind": "none", "tolerance_rel": 0.05}


def _drafter(folder: Path, weights: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"]}\n')
    (folder / "model.safetensors").write_bytes(weights)
    return folder


@pytest.fixture
def root(tmp_path):
    (tmp_path / "baselines").mkdir()
    (tmp_path / "mkdocs.yml").write_text("site_name: x\n")
    return tmp_path


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, env=git_env(), check=True, capture_output=True,
                          text=True).stdout.strip()


def _record(root, name, config, **kw):
    return bl.build(kind="probe", name=name, config=config, metrics={"accept_len": 2.0}, noise=NOISE, root=root,
                    command=f"invoke probe --drafter {config.get('drafter')} --force --record {name}", **kw)


# --------------------------------------------------------------------------- at run time


def test_a_recorded_result_carries_the_sha256_of_its_inputs_and_a_reproduce_command(root):
    folder = _drafter(root / "drafters/d", b"weights-a")
    b = _record(root, "run-a", {"drafter": "drafters/d", "target": "smollm2-135m", "data": ".eaglekb/gone"})
    inputs = b.provenance.inputs
    assert inputs["drafter"].sha256 == sha256_files([folder / "config.json", folder / "model.safetensors"])
    assert set(inputs["drafter"].files) == {"config.json", "model.safetensors"} and inputs["drafter"].basis
    assert inputs["target"].sha256 == sources.SOURCES["smollm2-135m"].sha256 and "GGUF" in inputs["target"].basis
    assert inputs["data"].sha256 is None and "not found" in inputs["data"].unknown
    assert b.provenance.reproduce == "invoke probe --drafter drafters/d --compare run-a"
    (folder / "model.safetensors").write_bytes(b"weights-b")  # same path, other weights: another identity
    assert _record(root, "run-b", {"drafter": "drafters/d"}).provenance.inputs["drafter"].sha256 != \
        inputs["drafter"].sha256


def test_inputs_are_found_by_config_key_including_a_server_s_paths():
    found = prov.config_inputs({"drafter": "d", "init": None, "server_info": {"model_path": "m",
                                "speculative_draft_model_path": "x"}, "steps": 3})
    assert found == {"drafter": ("drafter", "d"), "server_info.model_path": ("target", "m"),
                     "server_info.speculative_draft_model_path": ("drafter", "x")}


@pytest.mark.parametrize("edit, fragment", [
    (lambda d: d["provenance"].pop("inputs"), "provenance.inputs is missing"),
    (lambda d: d["provenance"]["inputs"].pop("drafter"), "lacks 'drafter'"),
    (lambda d: d["provenance"]["inputs"]["drafter"].update(sha256=None), "either sha256"),
    (lambda d: d["provenance"]["inputs"]["drafter"].update(sha256="abc"), "sha256"),
    (lambda d: d["provenance"].pop("reproduce"), "provenance.reproduce is missing"),
    (lambda d: d["provenance"].update(reproduce="invoke probe --record run-a"), "--record"),
    (lambda d: d["provenance"].update(reproduce="invoke probe --compare run-a --force"), "--force"),
    (lambda d: d["provenance"].update(reproduce="invoke probe"), "does not compare"),
])
def test_schema_v2_refuses_a_measured_result_without_hashes_or_reproduce(root, edit, fragment):
    _drafter(root / "drafters/d", b"w")
    path = bl.write(_record(root, "run-a", {"drafter": "drafters/d"}), root)
    assert_edit_refused(path, edit, fragment)


def test_a_v1_file_is_read_but_refused_in_the_tree_with_one_line(root):
    _drafter(root / "drafters/d", b"w")
    path = bl.write(_record(root, "old", {"drafter": "drafters/d"}), root)
    data = json.loads(path.read_text())
    data["schema_version"] = 1
    del data["provenance"]["inputs"], data["provenance"]["reproduce"]
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    assert bl.load(path).schema_version == 1  # diffs against old revisions still read it
    ok, problems = bl.check_all(root)
    assert ok == [] and len(problems) == 1 and str(path) in problems[0] and "invoke baselines.identity" in problems[0]
    with pytest.raises(SchemaError, match="schema v1 baseline"):
        bl.load_all(root, current=True)


# --------------------------------------------------------------------------- backfill from git history


def _v1(root: Path, name: str, drafter: str, commit: str, *, dirty: bool, created: str) -> Path:
    b = _record(root, name, {"drafter": drafter}, created_at=created)
    data = b.model_dump(mode="json")
    data["schema_version"] = 1
    data["provenance"].update(git_commit=commit, git_dirty=dirty)
    del data["provenance"]["inputs"], data["provenance"]["reproduce"]
    path = root / "baselines/probe" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


def test_backfill_takes_the_files_the_run_read_from_git_history(root):
    _git(root, "init", "-q", "-b", "main")
    a = _drafter(root / "drafters/d", b"round-a")
    sha_a = sha256_files([a / "config.json", a / "model.safetensors"])
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "round a")
    c1 = _git(root, "rev-parse", "HEAD")
    # A clean run at c1; a run from a dirty tree that already held round b (committed with its result, later).
    _v1(root, "clean", "drafters/d", c1, dirty=False, created="2026-01-01T00:00:00Z")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "clean result")
    (a / "model.safetensors").write_bytes(b"round-b")
    sha_b = sha256_files([a / "config.json", a / "model.safetensors"])
    _v1(root, "dirty", "drafters/d", c1, dirty=True, created="2026-01-02T00:00:00Z")
    _v1(root, "local", ".eaglekb/runs/x/drafter", c1, dirty=False, created="2026-01-02T00:00:00Z")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "round b with its result")
    _v1(root, "fresh", "drafters/d", c1, dirty=True, created="2026-01-03T00:00:00Z")  # not committed yet

    changed = dict(identity.backfill(root))
    assert set(changed) == {"probe/clean", "probe/dirty", "probe/local", "probe/fresh"}
    got = {n: bl.load_id(f"probe/{n}", root).provenance for n in ("clean", "dirty", "local", "fresh")}
    assert got["clean"].inputs["drafter"].sha256 == sha_a and "clean" in got["clean"].inputs["drafter"].basis
    assert got["clean"].inputs["drafter"].git == f"{c1}:drafters/d"
    assert got["dirty"].inputs["drafter"].sha256 == sha_b and "as committed with this result" in \
        got["dirty"].inputs["drafter"].basis
    assert got["local"].inputs["drafter"].sha256 is None and "not in git" in got["local"].inputs["drafter"].unknown
    assert got["fresh"].inputs["drafter"].sha256 == sha_b and "not committed yet" in got["fresh"].inputs["drafter"].basis
    assert all(p.reproduce.endswith(f"--compare {n}") and "--force" not in p.reproduce for n, p in got.items())
    # The clean run read round a from drafters/d, which now holds round b: `baselines.check` says so.
    problems = bl.check_all(root)[1]
    assert len(problems) == 1 and "probe/clean.json" in problems[0] and "now holds other files" in problems[0]
    assert identity.backfill(root) == []  # repeatable: complete files stay as they are


def test_backfill_marks_a_result_superseded_by_its_summary(root):
    _drafter(root / "drafters/d", b"w")
    path = _v1(root, "old", "drafters/d", None, dirty=False, created="2026-01-01T00:00:00Z")
    data = json.loads(path.read_text())
    data["summary"] = "Superseded by the r4 default (its *-r4 baselines): accept_len 2.06"
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    identity.backfill(root)
    assert bl.load(path).superseded_by == "Superseded by the r4 default (its *-r4 baselines)"


def test_a_drafter_folder_without_its_weights_has_no_identity(root):
    folder = root / "drafters/d"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}\n")  # the weights are away (a transfer): not another drafter
    entry = prov.input_identity("drafter", "drafters/d", root)
    assert entry["sha256"] is None and "incomplete" in entry["unknown"]


def test_a_comparison_names_an_input_whose_content_changed(root):
    folder = _drafter(root / "drafters/d", b"round-a")
    old = _record(root, "run", {"drafter": "drafters/d"})
    (folder / "model.safetensors").write_bytes(b"round-b")
    cmp = bl.compare(_record(root, "run", {"drafter": "drafters/d"}), old)
    assert set(cmp.inputs_differ) == {"drafter"} and "input drafter differs by content" in cmp.text()
    assert bl.compare(old, old).inputs_differ == {}
