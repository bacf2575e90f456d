"""The promises of issue 16, one example each: the one boundary, confined paths, guarded baselines, refused
measurements and hostile files. (The property tests beside this file try many more inputs.)"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.hostile import ROOT, drafter_files, one_line_failure, run_cli, story_run

def plan(cycle_ms: float = 30, *extra: str) -> list[str]:
    return ["plan", "--baseline-tps=82", f"--cycle-ms={cycle_ms}", "--accept-len=2.0", *extra]


PLAN = plan()


def _refused(res, *fragments: str) -> str:
    assert res.reached is None, res
    assert res.code == 2 and one_line_failure(res) is None, res
    line = res.err_lines[0]
    assert line.startswith("error: "), line
    for f in fragments:
        assert f in line, (f, line)
    return line


# --------------------------------------------------------------------------- the boundary


def test_a_bug_is_one_line_and_its_traceback_needs_eaglekb_debug(ws, monkeypatch):
    from eaglekb.measure import viability

    monkeypatch.setattr(viability, "plan", lambda **kw: 1 / 0)
    res = run_cli(PLAN)
    assert res.code == 2 and len(res.err_lines) == 1 and "Traceback" not in res.err
    for fragment in ("internal error: ZeroDivisionError", "bug in eaglekb", "EAGLEKB_DEBUG=1"):
        assert fragment in res.err_lines[0]
    monkeypatch.setenv("EAGLEKB_DEBUG", "1")
    with pytest.raises(ZeroDivisionError):
        run_cli(PLAN)


def test_the_real_command_line_shows_no_traceback_and_help_runs_nothing(tmp_path):
    env = {**os.environ, "EAGLEKB_ROOT": str(ROOT)}
    bad = subprocess.run([sys.executable, "-m", "invoke", "bench", "--num-prompts", "abc"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--num-prompts" in bad.stderr, bad.stderr
    helped = subprocess.run([sys.executable, "-m", "invoke", "inspect", "--help"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and "Usage: invoke inspect" in helped.stdout and not helped.stderr


def test_a_value_with_a_newline_stays_one_line(ws):
    line = _refused(run_cli(["plan", "--baseline-tps=8\n2", "--cycle-ms=30"]), "--baseline-tps", "8\\n2")
    assert "\n" not in line


def test_options_are_named_as_typed_and_checked_before_work(ws):
    _refused(run_cli(["bench", "--num-prompts=abc"]), "--num-prompts")
    _refused(run_cli(["bench", "--steps=0"]), "--steps")
    _refused(run_cli(["bench", "--max-new-tokens=0"]), "--max-new-tokens")
    _refused(run_cli(["probe", "--max-new-tokens=0"]), "--max-new-tokens")
    _refused(run_cli(["finetune", "--data=in", "--draft-vocab-size=1e9"]), "--draft-vocab-size")
    _refused(run_cli(["finetune", "--data=in", "--draft-vocab-size=1000000000"]), "--draft-vocab-size")
    _refused(run_cli(["story.run", "--tiny", "--export-max-mib=-1"]), "--export-max-mib")
    _refused(run_cli(["datagen", "--threads=lots"]), "--threads")


def test_interrupt_is_exit_130_and_one_line(ws, monkeypatch):
    from eaglekb.measure import viability

    def interrupted(**kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(viability, "plan", interrupted)
    res = run_cli(PLAN)
    assert res.code == 130 and res.err_lines == ["error: interrupted; nothing was recorded"]


@pytest.mark.parametrize("err, fragment", [(errno.EROFS, "read-only file system"), (errno.ENOSPC, "no space left"),
                                           (errno.EACCES, "permission denied")])
def test_an_unwritable_or_full_output_folder_is_one_line_and_keeps_the_old_file(ws, monkeypatch, err, fragment):
    import tempfile

    assert run_cli(plan(30, "--record=disk-test", "--force")).code == 0
    path = ws.root / "baselines/plan/disk-test.json"
    before = path.read_bytes()

    def failing(*a, **k):
        raise OSError(err, os.strerror(err), str(path.parent))

    monkeypatch.setattr(tempfile, "mkstemp", failing)
    _refused(run_cli(plan(31, "--record=disk-test", "--force")), fragment, str(path.parent))
    assert path.read_bytes() == before


def test_a_special_file_as_output_is_one_line(ws):
    _refused(run_cli(["vocab.build", "--out=/proc/eaglekb-hostile.safetensors", "--draft-vocab-size=8",
                      "--counts=in/counts.safetensors"]), "file system error")


# --------------------------------------------------------------------------- baselines


def test_record_refuses_an_existing_name_unless_force(ws):
    path = ws.root / "baselines/plan/hx-record.json"
    assert run_cli(plan(30, "--record=hx-record")).code == 0
    first = path.read_bytes()
    _refused(run_cli(plan(40, "--record=hx-record")), "already recorded", "--record", "--force")
    assert path.read_bytes() == first
    assert run_cli(plan(40, "--record=hx-record", "--force")).code == 0
    assert json.loads(path.read_text())["config"]["cycle_ms"] == 40.0


def test_a_cited_record_is_never_replaced_by_a_run(ws):
    doc = json.loads((ws.root / "baselines/plan/k25-investigation.json").read_text())
    doc.update(name="hx-cited", source="recorded", citation={"document": "an external report", "section": "2"})
    path = ws.root / "baselines/plan/hx-cited.json"
    path.write_text(json.dumps(doc, sort_keys=True, indent=2) + "\n")
    before = path.read_bytes()
    _refused(run_cli(plan(30, "--record=hx-cited", "--force")), "cited record")
    assert path.read_bytes() == before
    # checked before any work starts: the benchmark and the probe never began
    _refused(run_cli(["bench", "--record=k25-cycle-split", "--force"]), "cited record")
    _refused(run_cli(["probe", "--record=k25-phase0-k2-drafter"]), "cited record")


def test_record_and_compare_names_are_checked_before_work(ws):
    _refused(run_cli(["bench", "--compare=no-such-run"]), "--compare", "no such baseline")
    _refused(run_cli(["bench", "--record=../escape"]), "--record")
    _refused(run_cli(["probe", "--record=Has Space"]), "--record")


def test_check_fails_when_the_root_is_missing_or_holds_no_baselines(ws, monkeypatch, tmp_path):
    missing = tmp_path / "nowhere"
    monkeypatch.setenv("EAGLEKB_ROOT", str(missing))
    _refused(run_cli(["baselines.check"]), "EAGLEKB_ROOT")
    _refused(run_cli(PLAN), "EAGLEKB_ROOT")  # and plan does not create the folder
    assert not missing.exists()
    (tmp_path / "empty" / "baselines").mkdir(parents=True)
    monkeypatch.setenv("EAGLEKB_ROOT", str(tmp_path / "empty"))
    res = run_cli(["baselines.check"])
    assert res.code == 1 and "no baseline files" in res.out and "0 baselines valid" in res.out


def test_a_dangling_link_or_invalid_utf8_baseline_is_a_problem(ws):
    link = ws.root / "baselines/plan/dangling.json"
    bad = ws.root / "baselines/plan/latin1.json"
    link.symlink_to(ws.root / "gone.json")
    bad.write_bytes('{"summary": "caf\xe9"}'.encode("latin-1"))
    try:
        res = run_cli(["baselines.check"])
        assert res.code == 1 and not res.err
        assert any("dangling" in l and "dangling.json" in l for l in res.out.splitlines()), res.out
        assert any("not UTF-8" in l and "latin1.json" in l for l in res.out.splitlines()), res.out
        _refused(run_cli(PLAN), "dangling")
    finally:
        link.unlink()
        bad.unlink()


# --------------------------------------------------------------------------- confined paths


def test_remap_never_deletes_its_source_or_a_folder_that_is_not_a_drafter(ws, tmp_path):
    import shutil

    src = tmp_path / "models" / "drafter"
    shutil.copytree(ws.inputs / "drafter", src)
    files = sorted(p.name for p in src.iterdir())
    for out in (tmp_path / "models", src, src / "inner", tmp_path):
        _refused(run_cli(["remap", str(src), "in/mapping.safetensors", str(out), "--force"]), "--out")
    assert sorted(p.name for p in src.iterdir()) == files
    other = tmp_path / "notes"
    (other / "sub").mkdir(parents=True)
    (other / "keep.txt").write_text("x")
    _refused(run_cli(["remap", str(src), "in/mapping.safetensors", str(other), "--force"]), "replaces only a drafter folder")
    assert (other / "keep.txt").read_text() == "x"
    out = tmp_path / "remapped"
    assert run_cli(["remap", str(src), "in/mapping.safetensors", str(out)]).code == 0
    assert run_cli(["remap", str(src), "in/mapping.safetensors", str(out), "--force"]).code == 0


def test_story_record_keeps_manifest_names_inside_the_destination(ws, tmp_path):
    victim = tmp_path / "drafters" / "smollm2-135m-default"
    victim.mkdir(parents=True)
    (victim / "model.safetensors").write_text("the committed drafter")
    run = tmp_path / "x" / "y" / "run"
    story_run(run, "../../../drafters/smollm2-135m-default")
    dest = tmp_path / "x" / "y" / "dest"
    for extra in (["--dry-run"], []):
        _refused(run_cli(["story.record", str(run), "hx", "--drafters", str(dest), *extra]), "unsafe drafter name")
    assert (victim / "model.safetensors").read_text() == "the committed drafter"
    assert not dest.exists()


def test_story_record_dry_run_writes_nothing_and_an_unfinished_run_is_refused(ws, tmp_path):
    run = tmp_path / "run"
    story_run(run, "b-remap")
    res = run_cli(["story.record", str(run), "hx", "--drafters", str(tmp_path / "d"), "--dry-run"])
    assert res.code == 0 and "not unpacked" in res.out, res
    assert not (tmp_path / "d").exists()
    assert run_cli(["story.record", str(run), "hx", "--drafters", str(tmp_path / "d")]).code == 0
    assert (tmp_path / "d" / "b-remap" / "config.json").read_bytes() == drafter_files()["config.json"]
    story_run(tmp_path / "killed", "a", complete=False)
    _refused(run_cli(["story.record", str(tmp_path / "killed"), "hx"]), "did not finish")


# --------------------------------------------------------------------------- hostile files


def _target_copy(ws, tmp_path, edit=None) -> Path:
    import shutil

    folder = tmp_path / "target"
    shutil.copytree(ws.inputs / "target", folder)
    if edit:
        doc = json.loads((folder / "config.json").read_text())
        edit(doc)
        (folder / "config.json").write_text(json.dumps(doc))
    return folder


def test_a_pickle_checkpoint_is_refused_and_never_unpickled(ws, tmp_path):
    import pickle

    class Evil:
        def __reduce__(self):
            return (Path.touch, (tmp_path / "PWNED",))

    folder = _target_copy(ws, tmp_path)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(Evil()))
    for argv in (["datagen", f"--target={folder}", "--prompts-file=in/prompts.txt"],
                 ["inspect", "in/drafter", f"--target={folder}"], ["probe", f"--target={folder}"]):
        res = run_cli(argv)
        if res.reached is None:
            _refused(res, "pickle")
    from eaglekb.io.errors import IntegrityError
    from eaglekb.models.target import Target

    with pytest.raises(IntegrityError, match="pickle"):
        Target.load(folder)
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("edit, fragment", [
    (lambda d: d.update(rope_theta="abc"), "rope_theta"),
    (lambda d: d.update(hidden_size=1e7), "hidden_size"),
    (lambda d: d.update(hidden_size=10**7), "hidden_size"),
    (lambda d: d.update(num_hidden_layers=4000, intermediate_size=500000), "larger than its weights"),
])
def test_a_hostile_target_config_is_refused_before_allocating(ws, tmp_path, edit, fragment):
    from eaglekb.io.errors import EaglekbError
    from eaglekb.models.target import Target

    folder = _target_copy(ws, tmp_path, edit)
    if "larger" not in fragment:  # the config check when the target is resolved; the size check when loaded
        _refused(run_cli(["datagen", f"--target={folder}", "--prompts-file=in/prompts.txt"]), fragment)
    t0 = time.perf_counter()
    with pytest.raises(EaglekbError, match=fragment):
        Target.load(folder)
    assert time.perf_counter() - t0 < 10


def test_a_random_target_too_large_for_memory_is_refused(ws, tmp_path):
    from eaglekb.io.errors import BadInput
    from eaglekb.measure.setup import check_random_target

    folder = _target_copy(ws, tmp_path, lambda d: d.update(hidden_size=65536, num_hidden_layers=4000,
                                                           intermediate_size=1 << 20))
    with pytest.raises(BadInput, match="does not fit"):
        check_random_target(folder, "float32", "cpu")


@pytest.mark.parametrize("content, fragment", [
    (b'{"messages": [{"content": "hi"}]}\n', "role"),
    (b'{"messages": [{"role": "user", "content": 5}]}\n', "role"),
    (b'{"messages": []}\n', "role"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "not UTF-8"),
])
def test_a_bad_prompts_file_is_one_line_naming_it(ws, tmp_path, content, fragment):
    f = tmp_path / "prompts.jsonl"
    f.write_bytes(content)
    _refused(run_cli(["datagen", "--target=in/target", f"--prompts-file={f}"]), fragment, str(f))


def test_a_prompt_longer_than_the_run_allows_is_refused_not_cut():
    from helpers.models import word_tokenizer

    from eaglekb.data.corpora import Prompt, PromptSet
    from eaglekb.io.errors import BadInput
    from eaglekb.measure.setup import encode

    prompts = PromptSet("t", [Prompt(id="t:1", source="t", messages=({"role": "user", "content": "w9 " * 600},))])
    with pytest.raises(BadInput, match="prompt longer than the run allows") as exc:
        encode(word_tokenizer(), prompts, max_prompt_tokens=512)
    assert "t:1" in exc.value.line()
    assert len(encode(word_tokenizer(), prompts, max_prompt_tokens=4096)[0]) > 600


def test_a_draft_vocab_larger_than_the_target_vocab_is_refused_not_clamped(monkeypatch):
    import torch

    from eaglekb.formats.mapping import TokenCounts
    from eaglekb.io.errors import BadInput
    from eaglekb import training
    from eaglekb.training import loop

    where = getattr(training, "drafters", loop)  # the module whose data_mapping counts the data
    monkeypatch.setattr(where, "counts_from_dataset", lambda path, v: TokenCounts(torch.ones(v, dtype=torch.int64)))

    class Data:
        path, target = "ds", {"vocab_size": 128}

    with pytest.raises(BadInput, match="draft-vocab-size"):
        loop.data_mapping(Data(), 1000)
    assert loop.data_mapping(Data(), 40).draft_vocab_size == 40
