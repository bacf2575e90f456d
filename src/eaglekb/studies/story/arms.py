"""The drafters of the story: train one arm, probe it online, and the Phase 0 and Phase 1 stages over them.

Owns how one arm is trained (``train_arm``: fixed budgets, every step's loss kept) and summarised for
story.json, how a drafter is probed on the eval prompts (``probe_arm``, skipped past the soft limit), each
arm's row of the comparison table (``add_arm``), the step budget of a dataset, the small-budget view of B's
data (``subset_view``), and the stages ``phase0`` (drafter A, probed as-is on B) and ``phase1`` (the three
arms at equal budgets on B, optionally again on a small slice). Knows nothing about how the data was made.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from eaglekb import training
from eaglekb.data import datagen
from eaglekb.formats.shards import HEAD_FILE, MANIFEST, open_dataset
from eaglekb.io.files import read_json
from eaglekb.measure import probe
from eaglekb.studies.story.config import ARMS, EVAL_SET
from eaglekb.studies.story.drafters import file_hashes
from eaglekb.studies.story.stages import RunState


def steps_for(st: RunState, data_dir: Path, epochs: float) -> int:
    """Optimiser steps for ``epochs`` passes over a dataset's training share."""
    n = len(open_dataset(data_dir))
    return max(1, int(round(epochs * n * (1 - st.cfg.val_fraction) / st.cfg.batch_size)))


def _train_log(st: RunState, name: str, steps: int):
    """The trainer's log: every step is kept (first-step loss, full curves), about ten are printed."""
    every = max(1, steps // 10)

    def tlog(msg: str) -> None:
        if msg.startswith("step "):
            n = int(msg.split()[1].split("/")[0])
            if n != 1 and n % every:
                return
        st.say(f"[{name}] {msg}")

    return tlog


def _arm_doc(st: RunState, name: str, report: dict, wall: float, run_dir: Path) -> dict[str, Any]:
    """One trained arm as story.json holds it: config, metrics with the first step, curves, drafter hashes."""
    f = training.baseline_fields(report)
    h = report["history"]
    first = min(h["train_loss"], key=int)
    f["metrics"]["start"] = {"first_step_loss": h["train_loss"][first],
                             "first_step_acc0_pct": h["train_acc0"][first]}
    f["metrics"]["throughput"]["stage_wall_s"] = round(wall, 2)
    if isinstance(report["mapping"].get("remap"), dict):
        f["metrics"]["remap"] = {f"{k}_count": v for k, v in report["mapping"]["remap"].items()
                                 if isinstance(v, int) and not isinstance(v, bool)}
    config = {k: v for k, v in report["config"].items() if k != "stop_after"}
    config.update(arm=name, device=report["device"], gpu=st.env["gpu"], mapping_report=report["mapping"],
                  notes=report["notes"], data_totals=report["data"]["totals"])
    return {"kind": "finetune", "arm": name, "config": config, "metrics": f["metrics"], "series": f["series"],
            "summary": f"{name}: " + f["summary"], "env": st.env, "wall_s": round(wall, 2),
            "drafter": str(run_dir / "drafter"), "drafter_files": file_hashes(run_dir / "drafter")}


def train_arm(st: RunState, name: str, data_dir: Path, mapping: Path, *, init: Path | None = None,
              remap: bool = True, steps: int, lr: float, eval_every: int) -> dict[str, Any]:
    """Train one drafter into ``work/run-NAME`` (a fresh folder) and return its story record."""
    cfg = st.cfg
    run_dir = st.work / f"run-{name}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    tcfg = training.TrainConfig(
        data=str(data_dir), out=str(run_dir), init=str(init) if init else None, remap=remap,
        mapping=str(mapping), draft_vocab_size=cfg.draft_vocab_size, intermediate_size=cfg.intermediate_size or None,
        ttt_steps=cfg.ttt_steps, batch_size=cfg.batch_size, max_len=cfg.max_len, steps=steps,
        lr=lr, warmup_frac=0.03, min_lr_frac=0.05, val_fraction=cfg.val_fraction,
        max_val_sequences=128, eval_every=eval_every, save_every=0, log_every=1, seed=cfg.seed, device=st.dev)
    t0 = time.perf_counter()
    report = training.train(tcfg, progress=False, log=_train_log(st, name, steps))
    wall = time.perf_counter() - t0
    doc = _arm_doc(st, name, report, wall, run_dir)
    val = report.get("val") or {}
    st.say(f"[{name}] {wall:.1f} s; first-step loss {doc['metrics']['start']['first_step_loss']:.3f}; val acc "
           + " ".join(f"{a:.3f}" for a in val.get("acc", [])) + f"; simulated_acc_len {val.get('simulated_acc_len')}")
    return doc


def probe_arm(st: RunState, drafter: Path, label: str) -> dict[str, Any] | None:
    """The online probe of one drafter on the eval prompts; None (and a skip noted) past the soft limit."""
    cfg = st.cfg
    if st.past_soft_limit():
        st.story.doc["skipped"].append(f"probe {label}: past the soft limit")
        st.say(f"skipping probe {label}: past the soft limit")
        return None
    pcfg = probe.ProbeConfig(target=str(cfg.model), drafter=str(drafter), prompts=str(st.eval_file),
                             num_prompts=cfg.probe_prompts, max_new_tokens=cfg.probe_new_tokens,
                             steps=cfg.probe_steps, topk=1, device=st.dev, dtype=st.dtype, seed=cfg.seed,
                             graphs=st.gpu)
    t0 = time.perf_counter()
    p = probe.run(pcfg, progress=False)
    st.free_memory()  # the probe's engine (CUDA graphs, static caches) before the next training
    d = dict(p.to_dict(), env=st.env, wall_s=round(time.perf_counter() - t0, 2))
    d["config"]["prompts"] = f"{EVAL_SET} (first {cfg.probe_prompts}, from {Path(cfg.prompts).name})"
    d["prompts_manifest"] = dict(st.sets["eval"].manifest, count=cfg.probe_prompts, file=Path(cfg.prompts).name)
    st.say(f"[probe {label}] {p.summary} ({d['wall_s']} s)")
    return d


def add_arm(st: RunState, doc: dict[str, Any], probe_doc: dict[str, Any] | None) -> None:
    """Store an arm (with its probe) in story.json and its row in the arms table; save."""
    name = doc["arm"]
    if probe_doc is not None:
        doc["probe"] = probe_doc
    st.story.doc["runs"][name] = doc
    val = doc["metrics"].get("val", {})
    row = {"first_step_loss": doc["metrics"]["start"]["first_step_loss"],
           "val_acc_step0_pct": val.get("acc", {}).get("step0_pct"),
           "val_simulated_acc_plus_bonus_len": val.get("simulated_acc_plus_bonus_len"),
           "optimizer_steps": doc["metrics"]["run"]["optimizer_steps"]}
    if probe_doc is not None:
        pm = probe_doc["metrics"]
        row.update(online_accept_len=pm["online"]["accept_len"],
                   offline_simulated_accept_len=pm["offline"]["simulated_accept_len"],
                   cycle_ms=pm["online"]["cycle_ms"], baseline_tok_s=pm["baseline_tok_s"],
                   breakeven_len=pm["breakeven_len"], viable=probe_doc["verdict"]["viable"])
    st.story.doc["arms"][name] = row
    st.story.save()


def subset_view(src: Path, dst: Path, shards: int) -> Path:
    """A dataset folder holding only the first ``shards`` shards of ``src`` (links, no copies)."""
    man = read_json(src / MANIFEST, what="dataset manifest")
    keep = sorted(man["shards"])[:shards]
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for name in keep + [HEAD_FILE]:
        if (src / name).is_file():
            os.symlink((src / name).resolve(), dst / name)
    man["shards"] = {k: man["shards"][k] for k in keep}
    man["subset_of"] = {"path": str(src), "shards": len(keep), "identity_hash": man.get("identity_hash")}
    man["identity_hash"] = f"{man.get('identity_hash')}-first{len(keep)}"
    cfg = datagen.DatagenConfig(**{k: v for k, v in man["identity"]["config"].items()
                                   if k in datagen.DatagenConfig.__dataclass_fields__})
    datagen.write_manifest(dst, man, cfg)
    return dst


def phase0(st: RunState) -> None:
    """Drafter A from scratch on A with mapping A, then probed as-is on the B domain (Phase 0)."""
    t0 = time.perf_counter()
    a_steps = steps_for(st, st.data["a"], st.cfg.a_epochs)
    a_doc = train_arm(st, "a-scratch", st.data["a"], st.work / "mapping-a.safetensors", steps=a_steps,
                      lr=st.cfg.lr, eval_every=max(1, a_steps // st.cfg.eval_points))
    st.a_drafter = Path(a_doc["drafter"])
    st.story.stage("train_a", time.perf_counter() - t0)
    t0 = time.perf_counter()
    add_arm(st, a_doc, probe_arm(st, st.a_drafter, "A as-is on B (Phase 0)"))
    st.story.stage("probe_a", time.perf_counter() - t0)


def phase1(st: RunState) -> None:
    """The three arms at equal data and step budgets on B (probed), then on B's first shards (not probed)."""
    cfg = st.cfg
    b_steps = steps_for(st, st.data["b"], cfg.b_epochs)
    st.story.doc["phase1_budget"] = {"b_sequences_count": len(open_dataset(st.data["b"])),
                                     "optimizer_steps": b_steps, "batch_size": cfg.batch_size, "lr": cfg.b_lr}
    budgets = [("", st.data["b"])]
    if cfg.b_small:
        n_shards = max(1, cfg.b_small // cfg.shard_size)
        budgets.append(("-small", subset_view(st.data["b"], st.work / "data-b-small", n_shards)))
    for suffix, ddir in budgets:
        for arm in ARMS:
            name = f"b-{arm}{suffix}"
            if suffix and st.past_soft_limit():
                st.story.doc["skipped"].append(f"train {name}: past the soft limit")
                st.say(f"skipping {name}: past the soft limit")
                continue
            t0 = time.perf_counter()
            doc = train_arm(st, name, ddir, st.work / "mapping-b.safetensors",
                            init=st.a_drafter if arm != "scratch" else None, remap=arm != "noremap",
                            steps=b_steps, lr=cfg.b_lr, eval_every=max(1, b_steps // cfg.eval_points))
            st.story.stage(f"train_{name}", time.perf_counter() - t0)
            t0 = time.perf_counter()
            add_arm(st, doc, None if suffix else probe_arm(st, Path(doc["drafter"]), name))
            if not suffix:
                st.story.stage(f"probe_{name}", time.perf_counter() - t0)
