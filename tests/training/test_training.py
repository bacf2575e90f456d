"""eaglekb.training.loop: TTT alignment, overfit, resume, bad input, 2-process gloo DDP (CPU, tiny models)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from eaglekb.data import datagen
from eaglekb.training import loop as training
from eaglekb.io.errors import BadInput, Incompatible, IntegrityError

from helpers.datagen import make_target, prompts, small_cfg

pytestmark = pytest.mark.usefixtures("one_torch_thread")




@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Two tiny datasets from the same random target: soft labels and hard (argmax-only) labels."""
    root = tmp_path_factory.mktemp("train")
    target = datagen.load_target(make_target(root / "target"), dtype="float32")
    datagen.run(target, prompts(8), root / "soft", small_cfg(max_new_tokens=16), progress=False)
    datagen.run(target, prompts(8), root / "hard", small_cfg(max_new_tokens=16, store_final_hidden=False),
                progress=False)
    datagen.run(target, prompts(4), root / "online", small_cfg(max_new_tokens=16, features="online"), progress=False)
    return root


def cfg_for(root: Path, out: Path, **over) -> training.TrainConfig:
    kw = dict(data=str(root / "soft"), out=str(out), draft_vocab_size=40, intermediate_size=48, batch_size=4,
              steps=6, lr=3e-3, log_every=1, val_fraction=0.25, ttt_steps=3, warmup_frac=0.0)
    kw.update(over)
    return training.TrainConfig(**kw)


def test_ttt_step_k_equals_the_inference_forward_with_a_kv_cache():
    """Step k at anchor t = the drafter's cached forward after t+1 verified tokens and k drafted ones."""
    from helpers.models import tiny_drafter

    from eaglekb.models.drafter import KVCache

    torch.manual_seed(0)
    drafter = tiny_drafter().float()
    embed = torch.randn(128, 32)
    ids = torch.randint(0, 128, (1, 12))
    aux = torch.randn(1, 12, 96)
    ttt = training.TTTModel(drafter, embed, None, steps=3)
    with torch.no_grad():
        logits = ttt.step_logits(ids, aux)
        for t in (0, 4, 8):
            cache = KVCache()
            out = drafter(aux[:, : t + 1], inputs_embeds=embed[ids[:, 1:t + 2]], cache=cache)
            assert torch.allclose(out.logits[0, -1], logits[0][0, t], atol=1e-5)
            hidden = out.hidden[:, -1:]
            for k in (1, 2):
                out = drafter(hidden, inputs_embeds=embed[ids[:, t + k + 1:t + k + 2]], cache=cache)
                assert torch.allclose(out.logits[0, -1], logits[k][0, t], atol=1e-5), (t, k)
                hidden = out.hidden
        spec = training.TTTModel(drafter, embed, None, steps=3, positions="specforge").step_logits(ids, aux)
    assert torch.allclose(spec[0], logits[0], atol=1e-6) and not torch.allclose(spec[1], logits[1], atol=1e-4)


def test_metrics_from_counts():
    # counts per step: loss sum, positions, correct, chain-correct, chain-correct before
    st = torch.tensor([[10.0, 10, 8, 8, 10], [10.0, 10, 6, 5, 8], [10.0, 10, 5, 4, 5]])
    m = training.summarise(st)
    assert m["acc"] == [0.8, 0.6, 0.5] and m["full_acc"] == [0.8, 0.5, 0.4]
    assert m["cond_acc"] == pytest.approx([0.8, 5 / 8, 0.8])
    assert m["simulated_acc_len"] == pytest.approx(0.8 + 0.48 + 0.24)
    assert m["chain_acc_len"] == pytest.approx(1.7) and m["loss"] == pytest.approx(1 + 0.8 + 0.64)


def test_loss_decreases_on_a_tiny_overfit_set(data, tmp_path):
    rep = training.train(cfg_for(data, tmp_path / "run", data=str(data / "hard"), steps=25, lr=1e-2,
                                 val_fraction=0.0), progress=False)
    losses = rep["history"]["train_loss"]
    assert losses["25"] < 0.6 * losses["1"]
    assert (tmp_path / "run" / "drafter" / "model.safetensors").is_file()
    fields = training.baseline_fields(rep)
    assert fields["series"]["train_loss"]["unit"] == "_loss" and fields["metrics"]["throughput"]["train_tok_s"] > 0


def test_online_features_run_the_target_per_batch(data, tmp_path):
    rep = training.train(cfg_for(data, tmp_path / "o", data=str(data / "online"), steps=2, val_fraction=0.0,
                                 online_target=str(data / "target")), progress=False)
    assert rep["step"] == 2 and rep["history"]["train_loss"]["2"] > 0


def test_resume_after_interruption_continues_identically(data, tmp_path):
    whole = training.train(cfg_for(data, tmp_path / "whole"), progress=False)
    cut = training.train(cfg_for(data, tmp_path / "cut", stop_after=3), progress=False)
    assert cut["stopped_early"] and cut["step"] == 3
    resumed = training.train(cfg_for(data, tmp_path / "cut", resume=True), progress=False)
    assert resumed["step"] == 6
    for step in map(str, range(1, 7)):
        assert resumed["history"]["train_loss"][step] == pytest.approx(whole["history"]["train_loss"][step], abs=1e-6)
    assert resumed["val"]["loss"] == pytest.approx(whole["val"]["loss"], abs=1e-6)


def test_bad_inputs_are_one_line_and_write_nothing(data, tmp_path):
    training.train(cfg_for(data, tmp_path / "run", steps=2), progress=False)
    ckpts = sorted((tmp_path / "run" / "checkpoints").iterdir())
    # resume with another config
    with pytest.raises(Incompatible, match="another training config") as err:
        training.train(cfg_for(data, tmp_path / "run", steps=2, lr=1e-3, resume=True), progress=False)
    assert "lr" in str(err.value) and "\n" not in str(err.value)
    # a rerun into a used folder without --resume
    with pytest.raises(BadInput, match="already holds a training run"):
        training.train(cfg_for(data, tmp_path / "run", steps=2), progress=False)
    assert sorted((tmp_path / "run" / "checkpoints").iterdir()) == ckpts
    # an init drafter for a target of another hidden size
    from helpers.models import tiny_llama_config
    from eaglekb.models.drafter import build_drafter_for_target, save_drafter

    wide = build_drafter_for_target(tiny_llama_config(hidden_size=48), 40, aux_layer_ids=[1, 3, 4])
    save_drafter(wide, tmp_path / "wide")
    with pytest.raises(Incompatible, match="hidden size"):
        training.train(cfg_for(data, tmp_path / "x1", init=str(tmp_path / "wide")), progress=False)
    assert not (tmp_path / "x1").exists()


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_all_masked_and_corrupt_data_are_refused(data, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    masked = _copy(data / "soft", tmp_path / "masked")
    for shard in masked.glob("shard-*.safetensors"):
        with safe_open(str(shard), framework="pt") as fh:
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}
            meta = fh.metadata()
        tensors["loss_mask"] = torch.zeros_like(tensors["loss_mask"])
        save_file(tensors, str(shard), metadata=meta)
    with pytest.raises(BadInput, match="no loss tokens"):
        training.train(cfg_for(data, tmp_path / "o1", data=str(masked)), progress=False)
    corrupt = _copy(data / "soft", tmp_path / "corrupt")
    shard = corrupt / "shard-00001.safetensors"
    raw = bytearray(shard.read_bytes())
    raw[:8] = b"\x00\xff" * 4
    shard.write_bytes(bytes(raw))
    with pytest.raises(IntegrityError, match="shard-00001"):
        training.train(cfg_for(data, tmp_path / "o2", data=str(corrupt)), progress=False)
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_init_with_another_mapping_is_remapped_or_reproduces_the_failure(data, tmp_path):
    from eaglekb.models.drafter import load_drafter

    first = training.train(cfg_for(data, tmp_path / "a", steps=3), progress=False)
    assert first["mapping"]["source"].startswith("built from the data")
    # a drafter whose mapping differs from the data's: the ids 0..39
    src = load_drafter(tmp_path / "a" / "drafter")
    d2t_data = src.d2t.clone()
    src.set_mapping(torch.zeros(40, dtype=torch.long))
    from eaglekb.models.drafter import save_drafter

    save_drafter(src, tmp_path / "other")
    rep = training.train(cfg_for(data, tmp_path / "b", steps=1, init=str(tmp_path / "other")), progress=False)
    assert "remap" in rep["mapping"] and any("remapped" in n for n in rep["notes"])
    assert torch.equal(load_drafter(tmp_path / "b" / "drafter").d2t, d2t_data)
    bad = training.train(cfg_for(data, tmp_path / "c", steps=1, init=str(tmp_path / "other"), remap=False),
                         progress=False)
    assert any("WITHOUT moving lm_head rows" in n for n in bad["notes"])


def _ddp_worker(rank: int, world: int, store: str, cfg_doc: dict) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        training.train(training.TrainConfig(**cfg_doc), progress=False)
    finally:
        dist.destroy_process_group()


def test_two_process_gloo_ddp_agrees_with_one_process(data, tmp_path):
    import torch.multiprocessing as mp

    from eaglekb.models.drafter import load_drafter

    single = training.train(cfg_for(data, tmp_path / "one", steps=3), progress=False)
    cfg = cfg_for(data, tmp_path / "two", steps=3)
    doc = {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}
    os.environ.setdefault("PYTHONPATH", str(Path(__file__).parent))
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "store"), doc), nprocs=2, join=True)
    two = json.loads((tmp_path / "two" / training.METRICS).read_text())
    assert two["world_size"] == 2
    for step, loss in single["history"]["train_loss"].items():
        assert two["history"]["train_loss"][step] == pytest.approx(loss, abs=1e-4)
    a, b = load_drafter(tmp_path / "one" / "drafter"), load_drafter(tmp_path / "two" / "drafter")
    for (n, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.allclose(p.float(), q.float(), atol=1e-2), n


# ----------------------------------------------------------------------------- the runbooks, end to end


def _invoke(*args):
    import subprocess
    import sys

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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.gpu
def test_training_on_cuda_matches_the_cpu_shapes(data, tmp_path):
    rep = training.train(cfg_for(data, tmp_path / "gpu", device="cuda", steps=3), progress=False)
    assert rep["device"].startswith("cuda") and rep["step"] == 3


@pytest.mark.slow
def test_real_smollm2_datagen_and_two_training_steps(tmp_path):
    from eaglekb.models import sources

    folder = sources.model_dir("smollm2-135m")
    if not (folder / "config.json").is_file():
        pytest.skip("smollm2-135m not prepared (invoke models.prepare)")
    target = datagen.load_target(folder, dtype="float32")
    man = datagen.run(target, prompts(2), tmp_path / "ds", small_cfg(max_new_tokens=16, max_len=256,
                                                                     dtype="bfloat16"), progress=False)
    assert man["totals"]["hidden_bytes_per_token"] == 4 * 576 * 2
    rep = training.train(cfg_for(tmp_path, tmp_path / "run", data=str(tmp_path / "ds"), draft_vocab_size=12288,
                                 intermediate_size=1536, steps=2, batch_size=2, val_fraction=0.0, ttt_steps=7),
                         progress=False)
    assert rep["drafter"]["bf16_bytes"] <= 25_000_000
