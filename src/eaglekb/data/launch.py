"""Datagen over several GPUs: one process per GPU on disjoint prompt shards, merged into one dataset.

Owns ``launch`` (write the prompt set and the config once, start ``nproc`` processes
``python -m eaglekb.data --config RUN.json --rank R --world N`` with
``CUDA_VISIBLE_DEVICES=R`` and NVLink multicast off (``NCCL_NVLS_ENABLE=0``,
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, ``NVSHMEM_DISABLE_NVLS=1``), watch them, stop them
all when one fails, then ``merge``), ``run_part`` (what one process does: prompts
``R::N`` of the set into ``part-R-of-N/``) and ``merge`` (one manifest over the parts'
shards, keyed ``part-R-of-N/shard-XXXXX.safetensors``, identity checked equal). The
processes share no state: each writes its own part and resumes it on a rerun.

Greedy rows of the engine generator do not depend on their batch company
(``eaglekb.engine.batch``), so a greedy dataset made on N GPUs holds the same sequences
as one made on one GPU (``eaglekb.formats.shards.compare_datasets`` checks it).

Knows nothing about the task runner.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from eaglekb.data.corpora import prompts_hash
from eaglekb.data.datagen import DatagenConfig, build, first_difference, write_manifest
from eaglekb.data.generation import progress_bar
from eaglekb.data.prompts import read_prompt_sets, write_prompt_sets
from eaglekb.formats.shards import HEAD_FILE, SHARD_GLOB, read_manifest
from eaglekb.io.errors import BadInput, EaglekbError, Incompatible, Unavailable
from eaglekb.io.files import atomic_write_json, read_json

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
RUN_FILE = "datagen-run.json"
PROMPTS_FILE = "datagen-prompts.jsonl"


def part_name(rank: int, world: int) -> str:
    return f"part-{rank}-of-{world}"


def check_nproc(nproc: int, device: str) -> None:
    """``nproc`` processes need that many GPUs on CUDA; one line otherwise."""
    if nproc < 1:
        raise BadInput("process count must be >= 1", where="--nproc", found=str(nproc))
    if device.startswith("cuda"):
        import torch

        have = torch.cuda.device_count()
        if nproc > have:
            raise BadInput("more processes than GPUs", where="--nproc", expected=f"<= {have} (GPUs present)",
                           found=str(nproc))


def run_part(conf: dict, rank: int, world: int, *, progress: bool = False) -> dict:
    """One process's share: prompts ``rank::world`` of the set into ``OUT/part-rank-of-world``."""
    out = Path(conf["out"])
    full = read_prompt_sets(out / PROMPTS_FILE, ["train"])["train"]
    part = type(full)(f"{full.name}-{part_name(rank, world)}", full.prompts[rank::world], manifest=full.manifest)
    cfg = DatagenConfig(**conf["config"])
    return build(conf["target"], part, out / part_name(rank, world), cfg, device=conf["device"],
                 model_dtype=conf.get("model_dtype"), progress=progress)


def _start(run_file: Path, out: Path, nproc: int, device: str) -> list[tuple[subprocess.Popen, Path]]:
    procs = []
    for r in range(nproc):
        env = dict(os.environ, **NO_MULTICAST)
        if device.startswith("cuda"):
            env["CUDA_VISIBLE_DEVICES"] = str(r)
        log = out / f"{part_name(r, nproc)}.log"
        fh = open(log, "w", encoding="utf-8")
        cmd = [sys.executable, "-m", "eaglekb.data", "--config", str(run_file), "--rank", str(r), "--world", str(nproc)]
        procs.append((subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT), log))
        fh.close()
    return procs


def _last_error(log: Path) -> str:
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines() if log.is_file() else []
    errors = [ln for ln in lines if ln.startswith("error: ")]
    return errors[0][len("error: "):] if errors else (lines[-1][:200] if lines else "no output")


def _watch(procs, out: Path, nproc: int, total: int, progress: bool) -> None:
    """Wait for every process; the first failure stops the others and comes back as one line."""
    bar = progress_bar(total, f"datagen x{nproc} -> {out.name}", progress)
    try:
        while True:
            codes = [p.poll() for p, _ in procs]
            bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                r, code = bad[0]
                raise Unavailable(f"datagen process {r} of {nproc} failed (exit {code})",
                                  where=str(procs[r][1]), found=_last_error(procs[r][1]))
            done = sum((read_manifest(out / part_name(r, nproc)) or {}).get("totals", {}).get("sequences", 0)
                       for r in range(nproc))
            bar.n = min(done, total)
            bar.refresh()
            if all(c == 0 for c in codes):
                return
            time.sleep(2.0)
    finally:
        bar.close()
        for p, _ in procs:
            if p.poll() is None:
                p.terminate()
        for p, _ in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def merge(out: Path, nproc: int, cfg: DatagenConfig, wall_s: float) -> dict:
    """One manifest over the parts: shards keyed by part, identity checked equal, throughput over all GPUs."""
    parts = [read_manifest(out / part_name(r, nproc)) for r in range(nproc)]
    missing = [r for r, m in enumerate(parts) if m is None]
    if missing:
        raise Incompatible("a datagen part has no manifest", where=str(out / part_name(missing[0], nproc)))
    first = parts[0]
    for r, m in enumerate(parts[1:], 1):
        if m["identity_hash"] != first["identity_hash"]:
            raise Incompatible("datagen parts were made with different configs", where=str(out / part_name(r, nproc)),
                               expected=first["identity_hash"], found=m["identity_hash"])
    merged = {k: first[k] for k in ("format", "format_version", "identity", "identity_hash", "prompts")}
    merged["shards"] = {f"{part_name(r, nproc)}/{name}": e for r, m in enumerate(parts) for name, e in m["shards"].items()}
    if "target_head" in first:  # the same head in every part: one copy at the top, where datasets keep it
        head = out / HEAD_FILE
        if not head.is_file():
            shutil.copy2(out / part_name(0, nproc) / HEAD_FILE, head)
        merged["target_head"] = first["target_head"]
    runs = [m.get("last_run", {}) for m in parts]
    tokens = sum(r.get("generated_tokens") or 0 for r in runs)
    merged["last_run"] = {"processes_count": nproc, "wall_s": round(wall_s, 3), "generated_tokens": tokens,
                          "generate_tok_s": round(tokens / max(max(r.get("generate_s") or 0 for r in runs), 1e-9), 2),
                          "parts": runs}
    merged["target_path"] = first.get("target_path")
    write_manifest(out, merged, cfg)
    return read_json(out / "manifest.json", what="dataset manifest")


def _check_rerun(out: Path, conf: dict) -> None:
    """A folder of an earlier several-process run resumes only with the same target, config and prompts; one
    whose processes wrote no shard yet (a run refused before its first) holds no data and starts afresh."""
    if not (out / RUN_FILE).is_file() or not any(out.glob(f"part-*/{SHARD_GLOB}")):
        return
    old = read_json(out / RUN_FILE, what="datagen run file")
    if "prompts_sha256" not in old and (out / PROMPTS_FILE).is_file():  # written before the hash was kept
        old["prompts_sha256"] = prompts_hash(read_prompt_sets(out / PROMPTS_FILE, ["train"])["train"].prompts)
    keys = ("target", "config", "model_dtype", "prompts_sha256")
    now_conf = json.loads(json.dumps({k: conf[k] for k in keys}))  # as the run file holds it (tuples as lists)
    where, was, now = first_difference({k: old.get(k) for k in keys}, now_conf)
    if where:
        raise Incompatible("output folder holds a datagen run with another config", where=str(out / RUN_FILE),
                           expected=f"{where} {was!r} (the earlier run's)", found=f"{now!r} (now)",
                           fix="rerun with the earlier options to resume, or give another --out")


def launch(target_path: str | Path, prompts, out: str | Path, cfg: DatagenConfig, *, nproc: int, device: str,
           model_dtype: str | None = None, progress: bool = True) -> dict:
    """``build`` in ``nproc`` processes (one per GPU) on disjoint prompt shards; returns the merged manifest."""
    cfg.check()
    check_nproc(nproc, device)
    out = Path(out)
    conf = {"target": str(target_path), "out": str(out), "config": asdict(cfg), "device": device,
            "model_dtype": model_dtype, "prompts_sha256": prompts_hash(prompts.prompts)}
    _check_rerun(out, conf)  # before anything is written: a rerun with another config leaves the folder as it was
    out.mkdir(parents=True, exist_ok=True)
    write_prompt_sets(out / PROMPTS_FILE, {"train": prompts})
    run_file = atomic_write_json(out / RUN_FILE, conf)
    t0 = time.perf_counter()
    _watch(_start(run_file, out, nproc, device), out, nproc, len(prompts) * len(cfg.temperatures()), progress)
    return merge(out, nproc, cfg, time.perf_counter() - t0)


def generate_dataset(target_path: str | Path, prompts, out: str | Path, cfg: DatagenConfig, *, nproc: int = 1,
                     device: str = "cpu", device_map: str | None = None, server: str | None = None,
                     server_model: str = "default", progress: bool = True,
                     time_budget_s: float | None = None) -> dict:
    """One process (``build``: local or through a server) or ``nproc`` processes (``launch``).

    ``time_budget_s`` (one process): no new shard starts after it; a rerun resumes the rest."""
    if nproc == 1:
        return build(target_path, prompts, out, cfg, device=device, device_map=device_map, server=server,
                     server_model=server_model, progress=progress, time_budget_s=time_budget_s)
    if server or device_map:
        raise BadInput("several processes regenerate locally only", where="--nproc",
                       expected="--nproc 1 with --server or --device-map", found=str(nproc))
    if time_budget_s is not None:
        raise BadInput("a time budget stops one process only", where="--time-budget-s",
                       expected="--nproc 1, or no budget (size the run with --per-source)",
                       found=f"--nproc {nproc}")
    return launch(target_path, prompts, out, cfg, nproc=nproc, device=device, progress=progress)


def main(argv: list[str] | None = None) -> int:
    """``python -m eaglekb.data --config RUN.json --rank R --world N`` (started by ``launch``)."""
    import argparse

    ap = argparse.ArgumentParser(description="One datagen process of a multi-GPU run (see eaglekb.data.launch).")
    ap.add_argument("--config", required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    args = ap.parse_args(argv)
    try:
        run_part(read_json(args.config, what="datagen run file"), args.rank, args.world)
    except EaglekbError as exc:
        print(f"error: {exc.line()}", flush=True)
        return exc.exit_code
    return 0
