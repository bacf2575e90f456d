"""Where a step's time goes on the GPU: kernels per step, time by kind, the top kernels.

Owns ``profile_engine``: after warm-up it replays the engine's captured graphs for one
plain decode step, one verify of the given speculation shape and one draft step under
``torch.profiler`` (CUPTI records the kernels inside graph replays), and reports per
step the kernel count, the summed kernel time, the wall time per replay (CUDA events,
no profiler), the time by kernel kind (GEMM, attention, inductor-fused Triton, copies
and indexing, other elementwise) and the top kernels by time. The gap between wall
time and summed kernel time is launch latency and idle time between kernels: the
number that says whether a step is bound by kernels or by launches.

Knows nothing about benches or baselines; ``eaglekb.measure.bench`` calls it with
``--profile``.
"""

from __future__ import annotations

from typing import Callable

import torch

KINDS = (
    ("gemm", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "gemv", "splitk")),
    ("attention", ("fmha", "attention", "flash", "efficient", "sdpa", "cudnn", "softmax")),
    ("triton", ("triton_",)),
    ("topk_sort", ("topk", "sort", "radix")),  # before copy_index: sbtopk::gatherTopK is a selection, not a gather
    ("copy_index", ("copy", "index", "scatter", "gather", "cat", "fill")),
    ("elementwise", ("elementwise", "vectorized", "reduce", "unrolled")),
)


def kernel_kind(name: str) -> str:
    low = name.lower()
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return kind
    return "other"


def _short(name: str, width: int = 60) -> str:
    name = name.split("(")[0].replace("void ", "")
    return name if len(name) <= width else name[: width - 3] + "..."


def profile_replays(replay: Callable[[], None], steps: int = 20) -> dict:
    """Kernel statistics of ``steps`` calls of ``replay`` (already warmed up), per call."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(steps):
        replay()
    end.record()
    torch.cuda.synchronize()
    wall_ms = start.elapsed_time(end) / steps
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            replay()
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == DeviceType.CUDA and "memcpy" not in e.name.lower() and "memset" not in e.name.lower():
            kernels.setdefault(e.name, []).append(e.time_range.elapsed_us())
    count = sum(len(v) for v in kernels.values()) / steps
    total_us = sum(sum(v) for v in kernels.values()) / steps
    by_kind: dict[str, float] = {}
    for name, times in kernels.items():
        by_kind[kernel_kind(name)] = by_kind.get(kernel_kind(name), 0.0) + sum(times) / steps
    top = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:8]
    return {"kernels_count": count, "kernel_ms": total_us / 1000.0, "wall_ms": wall_ms,
            "launch_gap_ms": max(wall_ms - total_us / 1000.0, 0.0),
            "by_kind": {f"{k}_ms": v / 1000.0 for k, v in sorted(by_kind.items())},
            "top": [f"{_short(n)}: {sum(t) / steps:.1f} us x{len(t) / steps:g}" for n, t in top]}


def _graph_replay(graphed, rows: int) -> Callable[[], None] | None:
    """The replay of the captured graph whose first input has ``rows`` query tokens, if any."""
    for key, cap in graphed.graphs.items():
        if key and key[0][0][-1] == rows:
            return cap.graph.replay
    return None


def profile_engine(engine, prompt: list[int], spec=None, steps: int = 20) -> dict:
    """Decode, verify and draft steps of a graphed engine (CUDA); warms up and captures first."""
    if not engine.graphs:
        raise ValueError("profile_engine needs an engine with CUDA graphs")
    engine.generate(prompt, 8)
    out = {"decode": profile_replays(engine._loop.graph.replay, steps)}
    if spec is not None and engine.drafter is not None:
        engine.speculative(prompt, 16, spec)
        verify = _graph_replay(engine._target_step, engine.pad_rows(spec.draft_tokens))
        if verify is not None:
            out["verify"] = profile_replays(verify, steps)
        draft = _graph_replay(engine._draft_step, 1 if spec.topk == 1 else spec.topk)
        if draft is not None:
            out["draft"] = profile_replays(draft, steps)
        fused = engine._fused.get((spec.steps, spec.topk, spec.draft_tokens))
        for name, graphed in ((("fused_draft", fused.draft), ("fused_verify", fused.verify)) if fused else ()):
            if graphed.graphs:  # the whole chain or tree draft / verify + accept of a cycle, one replay each
                out[name] = profile_replays(next(iter(graphed.graphs.values())).graph.replay, steps)
    return out
