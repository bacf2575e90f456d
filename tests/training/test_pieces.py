"""Resume across machines that do not outlive a run: checkpoints in pieces, and the bad input of a resume.

A checkpoint written in pieces (``--pieces-out``) and joined on another machine (``--resume-from``) continues the
run step for step; a missing, truncated or corrupt piece, a checkpoint of another drafter shape, target or mapping,
a corrupt checkpoint in place, an online target that is another model than the dataset's: one line naming both
sides, exit 2 from the runbook, and the checkpoint folder as it was.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eaglekb.data.generation import load_target
from eaglekb.io.errors import EaglekbError, Incompatible, IntegrityError, MissingFile
from eaglekb.io.pieces import check, sha256_file
from eaglekb.formats.mapping import build_mapping, save_mapping
from eaglekb.training.checkpoints import changed_setting, list_checkpoints
from eaglekb.training.loop import train
from helpers.datagen import make_target
from helpers.training import cfg_for

pytestmark = pytest.mark.usefixtures("one_torch_thread")
PIECE_MIB = 0.02  # ~20 KB: the tiny trainer state comes in several pieces


def _tree(folder: Path) -> dict:
    """Every file under ``folder`` with its hash (what 'untouched' compares)."""
    return {str(p.relative_to(folder)): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()} \
        if folder.exists() else {}


@pytest.fixture(scope="module")
def packed(data, tmp_path_factory):
    """An uninterrupted 6-step run, and the same run stopped at step 3 with its checkpoint in pieces."""
    root = tmp_path_factory.mktemp("pieces")
    whole = train(cfg_for(data, root / "whole"), progress=False)
    cut = train(cfg_for(data, root / "cut", stop_after=3, pieces_out=str(root / "carry"), piece_mib=PIECE_MIB),
                progress=False)
    return root, whole, cut


def test_pieces_joined_elsewhere_resume_the_run_step_for_step(data, packed, tmp_path):
    root, whole, cut = packed
    info = cut["pieces"]
    assert info["largest_bytes"] <= PIECE_MIB * (1 << 20) + 4096 and len(info["files"]) >= 4
    assert not any(f.endswith("model.safetensors") for f in info["files"])  # rebuilt from the float32 state
    carry = shutil.copytree(root / "carry", tmp_path / "arrived")  # another machine: only the pieces arrive
    resumed = train(cfg_for(data, tmp_path / "run", resume_from=str(carry)), progress=False)
    assert resumed["step"] == 6
    for step in map(str, range(1, 7)):
        assert resumed["history"]["train_loss"][step] == pytest.approx(whole["history"]["train_loss"][step], abs=1e-6)
    joined = tmp_path / "run" / "checkpoints"
    original = root / "cut" / "checkpoints" / "step-0000003"
    assert sha256_file(joined.parent / "checkpoints" / "step-0000006" / "model.safetensors")  # the run went on
    # the joined step-3 checkpoint was byte for byte the original (its drafter rebuilt and checked by hash)
    again = train(cfg_for(data, tmp_path / "run2", resume_from=str(carry), stop_after=1), progress=False)
    assert again["step"] == 4
    assert _tree(tmp_path / "run2" / "checkpoints" / "step-0000003") == _tree(original)


@pytest.mark.parametrize("damage", ["missing", "truncated", "corrupt", "manifest"])
def test_a_bad_piece_is_one_line_and_leaves_the_checkpoints_untouched(data, packed, tmp_path, damage):
    root, _, _ = packed
    carry = shutil.copytree(root / "carry", tmp_path / "arrived")
    part = sorted(carry.glob("*.part*"))[1]
    if damage == "missing":
        part.unlink()
    elif damage == "truncated":
        part.write_bytes(part.read_bytes()[:-100])
    elif damage == "corrupt":
        raw = bytearray(part.read_bytes())
        raw[10] ^= 0xFF
        part.write_bytes(bytes(raw))
    else:
        next(carry.glob("*.checkpoint.json")).write_text("{not json")
    out = tmp_path / "run"
    train(cfg_for(data, out, steps=6, stop_after=1), progress=False)  # a run folder with a checkpoint already
    before = _tree(out / "checkpoints")
    with pytest.raises(EaglekbError) as err:
        train(cfg_for(data, out, resume_from=str(carry)), progress=False)
    assert "\n" not in err.value.line() and (part.name in err.value.line() or damage == "manifest")
    assert isinstance(err.value, (MissingFile, IntegrityError)) or damage == "manifest"
    assert _tree(out / "checkpoints") == before


def test_a_checkpoint_of_another_config_names_the_setting_and_both_values(data, packed, tmp_path):
    root, _, _ = packed
    cases = [(dict(intermediate_size=64), "--intermediate-size 48", "64"),
             (dict(draft_vocab_size=30), "--draft-vocab-size 40", "30"),
             (dict(ttt_steps=4), "--ttt-steps 3", "4")]
    for over, expected, found in cases:
        with pytest.raises(Incompatible, match="another training config") as err:
            train(cfg_for(data, tmp_path / "run", resume_from=str(root / "carry"), **over), progress=False)
        line = err.value.line()
        assert f"expected {expected} (the checkpoint's)" in line and f"found {found} (now)" in line, line
        assert not (tmp_path / "run").exists()  # nothing joined, nothing written
    # another mapping (a file built from other counts) names the mapping
    other = build_mapping(_counts_reversed(data), 40)
    save_mapping(tmp_path / "other.mapping.safetensors", other)
    with pytest.raises(Incompatible, match="draft-vocab mapping"):
        train(cfg_for(data, tmp_path / "run", resume_from=str(root / "carry"),
                      mapping=str(tmp_path / "other.mapping.safetensors")), progress=False)
    assert not (tmp_path / "run").exists()


def _counts_reversed(data):
    import torch

    from eaglekb.formats.mapping import TokenCounts

    return TokenCounts(torch.arange(128, 0, -1, dtype=torch.int64))


def test_another_targets_data_names_the_target_not_an_internal_key(data, tmp_path):
    from eaglekb.data import datagen
    from helpers.datagen import prompts, small_cfg

    other = load_target(make_target(tmp_path / "t48", hidden=48), dtype="float32")
    datagen.run(other, prompts(8), tmp_path / "soft48", small_cfg(max_new_tokens=16), progress=False)
    train(cfg_for(data, tmp_path / "run", steps=2), progress=False)
    before = _tree(tmp_path / "run" / "checkpoints")
    with pytest.raises(Incompatible) as err:
        train(cfg_for(data, tmp_path / "run", steps=2, resume=True, data=str(tmp_path / "soft48")), progress=False)
    assert "the target (drafter target_hidden_size" in err.value.line() and "32 (the checkpoint's)" in err.value.line()
    assert _tree(tmp_path / "run" / "checkpoints") == before
    # online features with another model than the one that made the dataset
    with pytest.raises(Incompatible, match="another model than the one that made the dataset") as err:
        train(cfg_for(data, tmp_path / "o", data=str(data / "online"), online_target=str(tmp_path / "t48")),
              progress=False)
    assert "hidden 32" in err.value.line() and "hidden 48" in err.value.line()
    assert not (tmp_path / "o").exists()


def test_a_corrupt_checkpoint_in_place_is_one_line_and_untouched(data, tmp_path):
    train(cfg_for(data, tmp_path / "run", steps=2), progress=False)
    state = list_checkpoints(tmp_path / "run")[-1] / "trainer" / "state.safetensors"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    before = _tree(tmp_path / "run" / "checkpoints")
    with pytest.raises(EaglekbError) as err:
        train(cfg_for(data, tmp_path / "run", steps=2, resume=True), progress=False)
    assert "state.safetensors" in err.value.line() and "\n" not in err.value.line()
    assert _tree(tmp_path / "run" / "checkpoints") == before


def test_fingerprints_compare_as_json_and_name_the_cause():
    assert changed_setting({"a": [1, 2], "lr": 1e-3}, {"a": (1, 2), "lr": 2e-3}) == ("--lr", 1e-3, 2e-3)
    old = {"data": "x", "data_tokens": 5, "mapping_sha": "m1", "total_steps": 3}
    new = {"data": "y", "data_tokens": 6, "mapping_sha": "m2", "total_steps": 4}
    assert changed_setting(old, new)[0] == "--data (the dataset's identity)"  # the cause, not the mapping it moved


def test_the_runbook_exits_2_with_one_line_on_a_bad_piece(data, packed, tmp_path):
    root, _, _ = packed
    carry = shutil.copytree(root / "carry", tmp_path / "arrived")
    sorted(carry.glob("*.part*"))[0].unlink()
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "invoke", "finetune", "--data", str(data / "soft"), "--out",
                           str(tmp_path / "run"), "--draft-vocab-size", "40", "--intermediate-size", "48",
                           "--batch-size", "4", "--steps", "6", "--ttt-steps", "3", "--val-fraction", "0.25",
                           "--lr", "0.003", "--warmup-frac", "0", "--resume-from", str(carry), "--device", "cpu"],
                          cwd=repo, capture_output=True, text=True, timeout=600)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error")]
    assert proc.returncode == 2 and len(errors) == 1 and "pieces missing" in errors[0], proc.stderr[-800:]
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_new_data_continues_the_run_on_another_dataset_with_its_mapping(data, packed, tmp_path):
    """A session that cannot keep the last one's data generates more and goes on: --new-data keeps the step, the
    optimiser, the schedule and the checkpoint's mapping; without --new-data, or with another mapping, one line
    says what to pass, and nothing is written."""
    from eaglekb.data import datagen
    from helpers.datagen import prompts, small_cfg

    root, _, cut = packed
    target = load_target(make_target(tmp_path / "t1", seed=1), dtype="float32")  # same shape, other tokens
    datagen.run(target, prompts(8), tmp_path / "more", small_cfg(max_new_tokens=20), progress=False)
    mapping = str(root / "cut" / "checkpoints" / "step-0000003")
    with pytest.raises(Incompatible, match="pass --new-data"):
        train(cfg_for(data, tmp_path / "a", data=str(tmp_path / "more"), mapping=mapping,
                      resume_from=str(root / "carry")), progress=False)
    with pytest.raises(Incompatible, match="--mapping with the checkpoint"):  # a mapping that is not its own
        _refuse_other_mapping(data, tmp_path, root)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    went_on = train(cfg_for(data, tmp_path / "c", data=str(tmp_path / "more"), new_data=True,
                            resume_from=str(root / "carry")), progress=False)  # the checkpoint's mapping
    assert went_on["step"] == 6 and any("continued on other data at step 3" in n for n in went_on["notes"])
    assert went_on["mapping"]["source"].startswith("the checkpoint's")
    for step in map(str, range(1, 4)):  # the history of the first dataset is kept
        assert went_on["history"]["train_loss"][step] == cut["history"]["train_loss"][step]


def _refuse_other_mapping(data, tmp_path, root):
    """--new-data with a mapping file that is not the checkpoint's."""
    other = build_mapping(_counts_reversed(data), 40)
    save_mapping(tmp_path / "other.mapping.safetensors", other)
    train(cfg_for(data, tmp_path / "b", data=str(tmp_path / "more"), new_data=True,
                  mapping=str(tmp_path / "other.mapping.safetensors"), resume_from=str(root / "carry")),
          progress=False)
