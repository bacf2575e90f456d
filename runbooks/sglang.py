"""`invoke sglang.*`: the serving stack for a GPU host without registry access (pack, install), a server's life
(launch, stop), its cycle split.

The benchmark itself is `invoke bench.sglang` (runbooks/bench.py).
"""

from __future__ import annotations

from runbooks._common import (cli_errors, emit, env_pairs, finish, finish_text, one_of, real, refuse_ignored, shape_from_record, task,
                              text, whole)

_MIB = 1 << 20


@task(
    help={
        "stack": "pinned wheel set: sglang-0.5.17 (default) or a file of name==version lines",
        "out": "new folder for the pieces and their manifest (default .eaglekb/sglang/stack)",
        "wheels": "take the wheels from this folder instead of downloading them",
        "piece_mib": "largest piece in MiB (default 1024)",
        "force": "replace a piece folder this command wrote before (the new set is built beside it, then swapped in)",
        "json": "print one JSON document as the last line",
    },
    options={"piece_mib": whole(1, 1 << 16)},
)
def pack(c, stack="sglang-0.5.17", out=".eaglekb/sglang/stack", wheels=None, piece_mib=1024, force=False, json=False):
    """Fetch the pinned serving stack (where a registry is reachable), tar it with its checksums and split it into
    pieces, to install on a GPU host without registry access (invoke sglang.install)."""
    with cli_errors():
        from pathlib import Path

        from eaglekb.measure.sglang.stack import pack as lib_pack

        doc = lib_pack(stack, Path(out), wheels_dir=Path(wheels) if wheels else None, piece_bytes=piece_mib * _MIB,
                       force=bool(force), progress=not json)
    emit(doc, f"{doc['wheels_count']} wheels ({doc['wheels_bytes'] / _MIB:.0f} MiB) -> {len(doc['pieces'])} pieces "
              f"of <= {piece_mib} MiB in {out}\n  sha256 {doc['sha256']}\n  manifest {out}/{doc['name']}.pieces.json",
         json)


@task(
    help={
        "pieces": "folder holding every piece and the *.pieces.json manifest",
        "target": "new folder for the installed stack (used as PYTHONPATH by the server only)",
        "force": "replace a stack this command installed there before",
        "json": "print one JSON document as the last line",
    },
)
def install(c, pieces, target, force=False, json=False):
    """Check every piece, join, check each wheel against the set's checksums (a wheel the set does not list is
    refused), pip-install them into their own --target folder."""
    with cli_errors():
        from pathlib import Path

        from eaglekb.measure.sglang.stack import install as lib_install

        doc = lib_install(Path(pieces), Path(target), force=bool(force), progress=not json)
    emit(doc, (f"{doc['stack']} already installed in {target}" if doc["already_installed"] else
               f"{doc['stack']}: {doc['wheels_count']} wheels installed in {target} ({doc['install_s']} s)")
         + f"\n  use it for the server only: invoke sglang.launch --site {target} ...", json)


@task(
    iterable=["env"],
    help={
        "target": "served model: embedded name (smollm2-135m) or folder",
        "drafter": "EAGLE-3 drafter folder (none: a plain server)",
        "steps": "--speculative-num-steps (default 3)",
        "topk": "--speculative-eagle-topk (default 1)",
        "draft_tokens": "--speculative-num-draft-tokens (default steps + 1 for a chain)",
        "port": "port on 127.0.0.1 (default 30000)",
        "tp": "tensor-parallel GPUs (SGLang --tp, default 1)",
        "trust_remote_code": "let the server run the model repository's own code (SGLang --trust-remote-code)",
        "site": "the serving stack's folder (invoke sglang.install), put on the server's PYTHONPATH only",
        "dtype": "bfloat16 (default), float16 or float32",
        "mem_fraction_static": "SGLang --mem-fraction-static, a fraction of the GPU memory free when the server "
                               "starts (default: SGLang's)",
        "shape_from": "bench/NAME: the best point of that recorded sweep on a GPU (same drafter) as --steps, --topk "
                      "and --draft-tokens",
        "gpu_share": "this server's share of the whole GPU (0-1), turned into --mem-fraction-static against the "
                     "memory free now: start servers that share a GPU one after another, each with its share",
        "max_total_tokens": "KV pool cap in tokens (lets several servers share one GPU)",
        "cuda_graph_max_bs": "largest batch captured in CUDA graphs (default: SGLang's)",
        "disable_cuda_graph": "no CUDA graphs at all (F04 on the real system)",
        "disable_prefill_cuda_graph": "no prefill graphs (about 70 s less start-up; decode unchanged)",
        "extra": "more SGLang flags, as one quoted string",
        "env": "KEY=VALUE for the server process only, repeatable (e.g. SGLANG_ENABLE_OVERLAP_PLAN_STREAM=1)",
        "timeout_s": "seconds to wait for /health (default 600)",
        "python": "interpreter for the server (default: this one)",
        "json": "print one JSON document as the last line",
    },
    options={"port": whole(1, 65535), "tp": whole(1, 1024), "timeout_s": whole(1, 86400), "max_total_tokens": whole(1, 1 << 40),
             "cuda_graph_max_bs": whole(1, 1 << 16), "dtype": one_of("bfloat16", "float16", "float32"),
             "mem_fraction_static": real(above=0, hi=1), "gpu_share": real(above=0, hi=1), "extra": text},
)
def launch(c, target="smollm2-135m", drafter=None, steps=3, topk=1, draft_tokens=None, port=30000, tp=1,
           trust_remote_code=False, site=None,
           dtype="bfloat16", mem_fraction_static=None, gpu_share=None, max_total_tokens=None, cuda_graph_max_bs=None,
           disable_cuda_graph=False, disable_prefill_cuda_graph=False, extra="", env=None, timeout_s=600, python=None,
           json=False, shape_from=None):
    """Start an SGLang server (EAGLE-3 with --drafter) in the background; wait for /health; record server_info."""
    with cli_errors():
        refuse_ignored([(name, not drafter, "--drafter (a plain server drafts nothing)")
                        for name in ("steps", "topk", "draft_tokens", "shape_from")], locals())
        shape = shape_from_record(shape_from, locals(), drafter=drafter, device="cuda")
        if shape:
            steps, topk, draft_tokens = shape["steps"], shape["topk"], shape["draft_tokens"]
        import shlex
        import sys

        from eaglekb.measure.sglang.config import LaunchConfig
        from eaglekb.measure.sglang.server import (check_drafter, fraction_for_share, free_fraction, launch as lib_launch,
                                                   wait_ready)

        if gpu_share is not None and mem_fraction_static is not None:
            from eaglekb.io.errors import BadInput

            raise BadInput("two ways to size one server", where="--gpu-share / --mem-fraction-static",
                           expected="one of them", found=f"{gpu_share} and {mem_fraction_static}")
        model = check_drafter(target, drafter)
        if gpu_share is not None:
            mem_fraction_static = fraction_for_share(float(gpu_share), free_fraction())
        cfg = LaunchConfig(model_path=str(model), draft_model_path=drafter, steps=steps, topk=topk,
                           draft_tokens=draft_tokens, port=port, tp=tp, trust_remote_code=bool(trust_remote_code),
                           dtype=dtype, mem_fraction_static=mem_fraction_static,
                           max_total_tokens=max_total_tokens, cuda_graph_max_bs=cuda_graph_max_bs,
                           disable_cuda_graph=bool(disable_cuda_graph),
                           disable_prefill_cuda_graph=bool(disable_prefill_cuda_graph), disable_radix_cache=True,
                           enable_metrics=True, sleep_on_idle=True, extra=shlex.split(extra or ""),
                           env=env_pairs(env, "--env"))
        doc = wait_ready(lib_launch(cfg, site=site, python=python or sys.executable), timeout_s=timeout_s,
                         progress=not json)
    info = doc["server_info"]
    emit(doc, f"SGLang {info.get('version')} ready on {doc['url']} after {doc['ready_s']} s (pid {doc['pid']}, "
              f"log {doc['log']})\n  {doc['command']}", json)


@task(
    help={"port": "the port a server was launched on with invoke sglang.launch",
          "json": "print one JSON document as the last line"},
    options={"port": whole(1, 65535)},
)
def stop(c, port=30000, json=False):
    """Stop the server invoke sglang.launch started on --port (SIGTERM to its process group, then SIGKILL); a pid
    whose start time or command line no longer match what launch recorded is refused, never signalled."""
    with cli_errors():
        from eaglekb.measure.sglang.server import stop as lib_stop

        doc = lib_stop(port)
    emit(doc, f"stopped pid {doc['pid']} on :{port}" if doc["was_running"] else
         f"pid {doc['pid']} on :{port} had already exited (state removed)", json)


@task(
    help={
        "url": "a running SGLang server (CUDA graphs on: cycles are keyed on graph launches)",
        "target": "the served model (for the prompt's chat template): embedded name or folder",
        "prompts": "gsm8k-eval (default), humaneval, builtin, or a prompts file: the first prompt is decoded",
        "max_new_tokens": "tokens of the profiled request (default 128)",
        "num_steps": "forward steps the profiler records (default 40)",
        "out": "folder for the trace (default .eaglekb/sglang/profile)",
        "json": "print one JSON document as the last line",
        "record": "write baselines/bench/NAME.json",
        "compare": "compare with baselines/bench/NAME.json",
    },
    options={"num_steps": whole(4, 10_000)},
)
def profile(c, url="http://127.0.0.1:30000", target="smollm2-135m", prompts="gsm8k-eval", max_new_tokens=128,
            num_steps=40, out=".eaglekb/sglang/profile", json=False, record=None, compare=None):
    """Where SGLang's decode cycle goes at batch 1: its torch profiler, split into verify, draft, eager, idle."""
    with cli_errors():
        from eaglekb.measure.sglang.bench import profile_split

        res = profile_split(url, target, prompts, max_new_tokens, num_steps, out)
        doc = {"metrics": res["metrics"], "config": res["config"]}
        doc.update(finish(kind="bench", record=record, compare=compare, config=res["config"], metrics=res["metrics"],
                          noise={"repeats": 1, "spread_kind": "none", "spread": {}, "tolerance_rel": 0.25},
                          summary=res["summary"]))
    emit(doc, res["summary"] + f"\n  trace {res['config']['trace']}" + finish_text(doc), json)
