"""Bench and probe on a CUDA machine without invoke or pydantic: writes JSON under $OUT.

Runs, on the same prompts: the engine's plain decoding (eager and CUDA-graphed), EAGLE-3
speculative decoding over a sweep, transformers ``generate`` (dynamic cache), ``generate``
with static cache + torch.compile (failure recorded, not fatal), prompt-lookup decoding,
and the eager-versus-graphed decode-step and verify-cycle times (finding F04); then a
probe (offline + online acceptance, exactness in the chosen dtype, verdict).

Models travel as files: ``--target`` is a model folder (config + safetensors + tokenizer)
or ``random:DIR`` (a config folder: same architecture with random weights, for timings);
``--drafter`` a drafter folder or ``random`` (timings only: acceptance is meaningless).

    python scripts/gpu_bench.py --target /models/smollm2-135m --drafter drafters/smollm2-135m-default \\
        --out $OUT --dtype bfloat16 --sweep "3,1;5,1;4,4,16"

The JSON holds config, metrics, spreads and failures; the lead turns it into a baseline
with ``invoke`` on a machine that has it (``scripts/record_gpu_bench.py`` or by hand).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def _env() -> dict:
    import torch
    import transformers

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "cuda": torch.version.cuda, "gpu": gpu, "host": platform.node(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main(argv=None) -> int:
    from eaglekb.measure import bench
    from eaglekb.measure import probe
    from eaglekb.io.errors import EaglekbError

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="model folder or random:CONFIG_DIR")
    ap.add_argument("--drafter", default="random", help="drafter folder or random")
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu-out"), help="output folder (default $OUT)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", help="bfloat16, float16 or float32")
    ap.add_argument("--prompts", default="builtin", help="builtin, a corpora eval set or a prompts file")
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sweep", default="3,1;5,1;4,4,16", help="steps,topk[,draft_tokens];...")
    ap.add_argument("--peers", default="hf_generate,hf_prompt_lookup,hf_static_compile")
    ap.add_argument("--skip-probe", action="store_true")
    ap.add_argument("--probe-prompts", type=int, default=4)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = _env()
    try:
        cfg = bench.BenchConfig(target=args.target, drafter=args.drafter, prompts=args.prompts,
                                num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens,
                                sweep=bench.parse_sweep(args.sweep, None, None, None), repeats=args.repeats,
                                device=args.device, dtype=args.dtype, graphs="both",
                                peers=[p for p in args.peers.split(",") if p])
        t0 = time.perf_counter()
        report = bench.run(cfg)
        doc = dict(report.to_dict(), env=env, wall_s=time.perf_counter() - t0)
        (out / "bench.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        print(bench.render_text(report), flush=True)
        if not args.skip_probe:
            steps, topk, n = cfg.sweep[0]
            pcfg = probe.ProbeConfig(target=args.target, drafter=args.drafter, prompts=args.prompts,
                                     num_prompts=args.probe_prompts, max_new_tokens=args.max_new_tokens,
                                     steps=steps, topk=topk, draft_tokens=n, device=args.device, dtype=args.dtype)
            t0 = time.perf_counter()
            p = probe.run(pcfg)
            (out / "probe.json").write_text(json.dumps(dict(p.to_dict(), env=env, wall_s=time.perf_counter() - t0),
                                                       indent=2, sort_keys=True) + "\n")
            print(probe.render_text(p), flush=True)
    except EaglekbError as exc:
        print(f"error: {exc.line()}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
