"""eaglekb.training.launch and DDP: two gloo processes agree with one; the torchrun entry; the runbooks end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from eaglekb.models.drafter import load_drafter
from eaglekb.training.config import METRICS, TrainConfig
from eaglekb.training.launch import main
from eaglekb.training.loop import train
from helpers.training import cfg_for

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _ddp_worker(rank: int, world: int, store: str, cfg_doc: dict) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        train(TrainConfig(**cfg_doc), progress=False)
    finally:
        dist.destroy_process_group()


def test_two_process_gloo_ddp_agrees_with_one_process(data, tmp_path):
    single = train(cfg_for(data, tmp_path / "one", steps=3), progress=False)
    cfg = cfg_for(data, tmp_path / "two", steps=3)
    doc = {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}
    os.environ.setdefault("PYTHONPATH", str(Path(__file__).parent))
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "store"), doc), nprocs=2, join=True)
    two = json.loads((tmp_path / "two" / METRICS).read_text())
    assert two["world_size"] == 2
    per, mixed = two["val"]["by_source"]["t"], two["val"]  # the per-source sums reduced over processes too
    assert per["positions"] == mixed["positions"] == single["val"]["positions"]
    assert per["acc0"] == pytest.approx(mixed["acc"][0]) and per["simulated_acc_len"] == pytest.approx(
        mixed["simulated_acc_len"])
    for step, loss in single["history"]["train_loss"].items():
        assert two["history"]["train_loss"][step] == pytest.approx(loss, abs=1e-4)
    a, b = load_drafter(tmp_path / "one" / "drafter"), load_drafter(tmp_path / "two" / "drafter")
    for (n, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.allclose(p.float(), q.float(), atol=1e-2), n


def test_torchrun_entry_reports_a_library_error_as_one_line(tmp_path, capsys):
    assert main(["--config", str(tmp_path / "missing.json")]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("error: training config not found")
    (tmp_path / "bad.json").write_text(json.dumps({"data": "x", "out": "y", "stepz": 3}))
    assert main(["--config", str(tmp_path / "bad.json")]) == 2
    assert "unknown training option" in capsys.readouterr().out


# ----------------------------------------------------------------------------- the runbooks, end to end


def _invoke(*args):
    root = Path(__file__).resolve().parents[2]
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=root, capture_output=True, text=True,
                          timeout=600)


def test_invoke_datagen_and_finetune_smoke(data, tmp_path):
    prompts_file = tmp_path / "prompts.txt"
    prompts_file.write_text("tell me about owls.\nwhat is two plus two?\nhello there\nname a fruit.\n")
    out = _invoke("datagen", "--target", str(data / "target"), "--prompts-file", str(prompts_file),
                  "--max-new-tokens", "8", "--max-len", "96", "--batch-size", "2", "--shard-size", "2",
                  "--dtype", "float32", "--out", str(tmp_path / "ds"), "--threads", "1", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["totals"]["sequences"] == 4 and doc["totals"]["shards"] == 2
    out = _invoke("finetune", "--data", str(tmp_path / "ds"), "--out", str(tmp_path / "run"), "--steps", "2",
                  "--batch-size", "2", "--draft-vocab-size", "40", "--intermediate-size", "48", "--ttt-steps", "2",
                  "--val-fraction", "0.25", "--device", "cpu", "--threads", "1", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["step"] == 2 and len(doc["val"]["acc"]) == 2 and doc["throughput"]["tok_s"] > 0
    bad = _invoke("finetune", "--data", str(tmp_path / "nowhere"))
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode != 0 and len(lines) == 1 and "dataset folder not found" in lines[0]


@pytest.mark.slow
def test_invoke_finetune_two_processes_length_batching_online(data, tmp_path):
    """The GPU recipe's shape on CPU: torchrun with two gloo processes, length batching, online features."""
    out = _invoke("finetune", "--data", str(data / "online"), "--online-target", str(data / "target"),
                  "--out", str(tmp_path / "run"), "--steps", "3", "--batch-size", "4", "--batching", "length",
                  "--draft-vocab-size", "40", "--intermediate-size", "48", "--ttt-steps", "2", "--nproc", "2",
                  "--val-fraction", "0.25", "--save-every", "2", "--device", "cpu", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["step"] == 3 and doc["throughput"]["tok_s"] > 0
