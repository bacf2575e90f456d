"""Where an SGLang decode cycle goes on the GPU: its torch-profiler trace, read back and split.

Owns ``capture`` (SGLang's ``/start_profile`` for a number of forward steps while one request decodes;
the trace the scheduler writes, found in the output folder) and ``split`` (a Chrome trace as PyTorch's
profiler writes it, read with ``json`` only): GPU kernels grouped by the runtime call that launched them
(``cudaGraphLaunch`` or a single kernel launch, matched by correlation id), the graph with the most
kernels taken as the target's verify (``TARGET_VERIFY`` is one graph, tens of layers) and every other
graph as the drafter's; per cycle (from one verify launch to the next, the first and last cycles left
out): the period, GPU time in verify, draft graphs and eager kernels, the GPU's idle time (what the
scheduler and the host cost), and launches per cycle. A plain server's trace has one kind of graph:
its decode step. Knows nothing about the task runner.
"""

from __future__ import annotations

import gzip
import json
import statistics
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from eaglekb.io.errors import IntegrityError, Unavailable

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def read_trace(path: Path) -> list[dict]:
    """The events of a Chrome trace (``.json`` or ``.json.gz``); one line when it is not one."""
    try:
        raw = gzip.decompress(Path(path).read_bytes()) if str(path).endswith(".gz") else Path(path).read_bytes()
        doc = json.loads(raw)
    except (OSError, ValueError, EOFError) as exc:
        raise IntegrityError("not a readable profiler trace", where=str(path), found=type(exc).__name__) from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise IntegrityError("not a profiler trace", where=str(path), expected="traceEvents")
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]


def _corr(e: dict) -> Any:
    return (e.get("args") or {}).get("correlation")


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def launches(events: list[dict]) -> tuple[list[dict], dict]:
    """GPU work grouped by its launching runtime call: [{kind, ts, kernels, gpu_us, start, end}], runtime counts."""
    runtime = {_corr(e): e for e in events if e.get("cat") == "cuda_runtime" and _corr(e) is not None}
    groups: dict[Any, list[dict]] = defaultdict(list)
    for e in events:
        if e.get("cat") in GPU_CATS:
            groups[_corr(e)].append(e)
    out = []
    for corr, ks in groups.items():
        call = runtime.get(corr)
        kind = "graph" if call is not None and "GraphLaunch" in str(call.get("name")) else "eager"
        start = min(k["ts"] for k in ks)
        out.append({"kind": kind, "ts": call["ts"] if call else start, "kernels": len(ks),
                    "gpu_us": sum(k.get("dur", 0) for k in ks), "start": start,
                    "end": max(k["ts"] + k.get("dur", 0) for k in ks),
                    "intervals": [(k["ts"], k["ts"] + k.get("dur", 0)) for k in ks]})
    out.sort(key=lambda g: g["start"])
    counts = Counter(e.get("name") for e in runtime.values())
    return out, dict(counts)


def split(events: list[dict], *, skip: int = 2) -> dict:
    """Per-cycle medians (ms) of a decode trace: period, verify / draft / eager GPU time, GPU idle, launches."""
    groups, counts = launches(events)
    graphs = [g for g in groups if g["kind"] == "graph"]
    if not graphs:
        raise Unavailable("no CUDA graph launches in the trace", where="profiler trace",
                          expected="a server with CUDA graphs (the split keys cycles on graph launches)")
    biggest = max(g["kernels"] for g in graphs)
    anchors = [g for g in graphs if g["kernels"] == biggest]
    if len(anchors) < skip * 2 + 2:
        raise Unavailable("too few decode cycles in the trace", where="profiler trace",
                          expected=f">= {skip * 2 + 2} verify launches", found=str(len(anchors)))
    rows = []
    for a, b in zip(anchors[skip:-skip - 1], anchors[skip + 1:-skip]):
        inside = [g for g in groups if a["start"] <= g["start"] < b["start"]]
        period = b["start"] - a["start"]
        busy = _union_us([iv for g in inside for iv in g["intervals"]])
        rows.append({
            "cycle_ms": period / 1000,
            "verify_gpu_ms": sum(g["gpu_us"] for g in inside if g["kind"] == "graph" and g["kernels"] == biggest) / 1000,
            "draft_gpu_ms": sum(g["gpu_us"] for g in inside if g["kind"] == "graph" and g["kernels"] != biggest) / 1000,
            "eager_gpu_ms": sum(g["gpu_us"] for g in inside if g["kind"] == "eager") / 1000,
            "gpu_idle_ms": (period - busy) / 1000,
            "graph_launches_count": sum(g["kind"] == "graph" for g in inside),
            "eager_launches_count": sum(g["kind"] == "eager" for g in inside),
        })
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    med["cycles_count"] = len(rows)
    med["verify_graph_kernels_count"] = biggest
    other = sorted({g["kernels"] for g in graphs if g["kernels"] != biggest})
    med["draft_graphs_count"] = len(other)  # distinct drafter graphs (by kernel count): draft, draft extend
    med["draft_graph_kernels_count"] = sum(other)
    syncs = sum(v for k, v in counts.items() if "Synchronize" in str(k) or "Memcpy" in str(k))
    med["sync_or_copy_calls_count"] = syncs / max(len(anchors), 1)
    return med


def capture(client, prompt: list[int], max_new: int, out_dir: Path, *, num_steps: int = 40,
            timeout_s: float = 120.0) -> Path:
    """Profile ``num_steps`` forward steps of one request on the server; the trace file it wrote."""
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    before = set(out_dir.glob("*.trace.json*"))
    client.start_profile(str(out_dir), num_steps)
    client.generate(prompt, max_new)
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        new = sorted(set(out_dir.glob("*.trace.json*")) - before)
        if new:
            size = -1
            while new[-1].stat().st_size != size:  # written when the size stops changing
                size = new[-1].stat().st_size
                time.sleep(2.0)
            return new[-1]
        client.generate(prompt, 16)  # keep the scheduler stepping until the profiler has its steps
        time.sleep(0.5)
    raise Unavailable("SGLang wrote no profiler trace in time", where=str(out_dir),
                      expected=f"a *.trace.json.gz within {timeout_s:.0f} s")
