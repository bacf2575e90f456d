"""SGLang's launch command: the server settings a run uses and the argv that starts them.

Owns: ``LaunchConfig`` and ``launch_command`` (``python -m sglang.launch_server`` with the EAGLE-3 flags:
``--speculative-algorithm EAGLE3``, ``--speculative-draft-model-path``, ``--speculative-num-steps``,
``--speculative-eagle-topk``, ``--speculative-num-draft-tokens``, tensor parallelism and the rest).

The server's life (launch, health, stop) is ``eaglekb.measure.sglang.server``; the protocol of
``invoke bench.sglang`` (our engine beside the server, parity, concurrency) is ``eaglekb.measure.sglang.bench``;
the cycle split from SGLang's profiler, ``eaglekb.measure.sglang.trace``. Knows nothing about HTTP or the task runner.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from eaglekb.io.errors import BadInput


@dataclass
class LaunchConfig:
    """Server settings (SGLang flag names without the leading dashes)."""

    model_path: str
    draft_model_path: str | None = None
    steps: int = 3
    topk: int = 1
    draft_tokens: int | None = None  # None: steps + 1 for a chain
    tp: int = 1
    host: str = "127.0.0.1"
    port: int = 30000
    dtype: str | None = None
    mem_fraction_static: float | None = None
    cuda_graph_max_bs: int | None = None
    disable_cuda_graph: bool = False
    trust_remote_code: bool = False
    attention_backend: str | None = None
    max_total_tokens: int | None = None  # KV pool cap: several servers can share one GPU
    disable_radix_cache: bool = False  # repeated prompts do not hit the prefix cache (fair timings)
    disable_prefill_cuda_graph: bool = False  # shorter start-up (prefill graphs cost ~70 s on the H200)
    enable_metrics: bool = False  # per-request server timestamps in meta_info (the request split)
    sleep_on_idle: bool = False  # an idle server sleeps instead of polling (others share the host's cores)
    extra: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # set for the server process only (e.g. SGLANG_ENABLE_OVERLAP_PLAN_STREAM=1)


def launch_command(cfg: LaunchConfig, python: str = "python") -> list[str]:
    """argv for ``python -m sglang.launch_server`` (with EAGLE-3 when a drafter is given)."""
    for name in ("steps", "topk", "tp", "port"):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise BadInput(f"{name} must be a whole number >= 1", where=f"LaunchConfig.{name}", found=repr(v))
    cmd = [python, "-m", "sglang.launch_server", "--model-path", cfg.model_path, "--tp", str(cfg.tp),
           "--host", cfg.host, "--port", str(cfg.port)]
    if cfg.draft_model_path:
        n = cfg.draft_tokens if cfg.draft_tokens is not None else (cfg.steps + 1 if cfg.topk == 1 else None)
        if n is None:
            raise BadInput("a tree needs a draft-token budget", where="--draft-tokens",
                           expected="an integer (SGLang --speculative-num-draft-tokens)", found="none")
        if cfg.topk == 1 and n != cfg.steps + 1:
            raise BadInput("with topk 1 the draft tokens are steps + 1", where="--draft-tokens",
                           expected=str(cfg.steps + 1), found=str(n))
        cmd += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", cfg.draft_model_path,
                "--speculative-num-steps", str(cfg.steps), "--speculative-eagle-topk", str(cfg.topk),
                "--speculative-num-draft-tokens", str(n)]
    if cfg.dtype:
        cmd += ["--dtype", cfg.dtype]
    if cfg.mem_fraction_static is not None:
        cmd += ["--mem-fraction-static", str(cfg.mem_fraction_static)]
    if cfg.cuda_graph_max_bs is not None:
        cmd += ["--cuda-graph-max-bs", str(cfg.cuda_graph_max_bs)]
    if cfg.disable_cuda_graph:
        cmd.append("--disable-cuda-graph")
    if cfg.trust_remote_code:
        cmd.append("--trust-remote-code")
    if cfg.attention_backend:
        cmd += ["--attention-backend", cfg.attention_backend]
    if cfg.max_total_tokens is not None:
        cmd += ["--max-total-tokens", str(cfg.max_total_tokens)]
    for flag in ("disable_radix_cache", "disable_prefill_cuda_graph", "enable_metrics", "sleep_on_idle"):
        if getattr(cfg, flag):
            cmd.append("--" + flag.replace("_", "-"))
    return cmd + list(cfg.extra)


def command_line(cmd: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in cmd)
