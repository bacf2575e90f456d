"""Break-even on SGLang before training: the plain step and the speculative cycle, timed with an untrained drafter.

Owns ``invoke plan.sglang``: write a drafter of the target's shape with random weights (the right hidden size,
heads, vocabulary and a valid d2t/t2d mapping, SGLang's layout), serve the target plain and with that drafter,
time both on the same prompts (SGLang's own per-request timestamps: decode time / verify count is the cycle,
decode time / tokens the plain step), and turn them into the break-even accept length and the speedup each
accept length would buy, before a week goes into training. A drafter's weights change what it accepts, not
what a cycle costs: the cycle is the same drafter forward ``steps`` times and one verify of
``draft_tokens``, whatever the weights, so the untrained drafter times the cycle a trained one will pay
(``invoke bench.sglang --plan`` checks the prediction once the drafter exists).

The speedup of one request at an accept length is ``eaglekb.measure.viability.request_speedup`` (bench.sglang
uses it for the prediction it records beside the measured ratio). Knows nothing about the task runner.
"""

from __future__ import annotations

import re
import shlex
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from eaglekb.data.prompts import eval_prompts
from eaglekb.engine.timing import stats
from eaglekb.io.errors import BadInput, Incompatible, Unavailable
from eaglekb.io.files import read_json
from eaglekb.measure import setup as runsetup
from eaglekb.measure import viability
from eaglekb.formats.drafter import read_config
from eaglekb.measure.sglang.bench import Run, SGLangBenchConfig, _sglang_method, check_servers, passes, server_split
from eaglekb.measure.sglang.config import LaunchConfig
from eaglekb.measure.sglang.server import fraction_for_share, free_fraction, launch, stop_launched, summarize_info, wait_ready
from eaglekb.models import sources
from eaglekb.models.drafter import build_drafter_for_target, save_drafter
from eaglekb.models.server import SGLangClient

#: accept lengths (bonus included) the plan prices; above steps + 1 a chain cannot reach them
ACCEPT_GRID = (1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0)


@dataclass
class PlanConfig:
    target: str = "smollm2-135m"
    site: str | None = None  # the serving stack's folder (invoke sglang.install), when this task launches
    url: str | None = None  # a running speculative server (an untrained drafter's) instead of launching one
    plain_url: str | None = None  # a running plain server of the same target
    drafter_out: str | None = None  # where the untrained drafter is written (default under .eaglekb/plan/)
    draft_vocab_size: int = 32768
    seed: int = 0
    steps: int = 3
    topk: int = 1
    draft_tokens: int | None = None
    prompts: str = "builtin"
    num_prompts: int = 4
    max_new_tokens: int = 128
    repeats: int = 3
    warmup: int = 1
    port: int = 30100  # plain on port, speculative on port + 1
    dtype: str = "bfloat16"
    mem_fraction_static: float | None = None  # None: 0.8 of the GPU shared among the servers (0.4 each for two)
    max_total_tokens: int | None = None
    cuda_graph_max_bs: int | None = 8
    extra: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 900.0
    drafter_only: bool = False  # write the untrained drafter and say how to serve it; time nothing
    #: more speculative servers, each with its own extra SGLang flags and environment, timed against the same
    #: plain server: {name: {"extra": [...], "env": {...}}} (``parse_variant``)
    variants: dict[str, dict] = field(default_factory=dict)


_VARIANT_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
_ENV_TOKEN = re.compile(r"^[A-Z][A-Z0-9_]*=")


def parse_variant(text: str, option: str = "--variant") -> tuple[str, dict]:
    """``NAME=FLAGS``: a named speculative server with extra SGLang flags; tokens of the form KEY=VALUE (upper-case
    KEY) set its environment instead, e.g. ``overlap-plan=SGLANG_ENABLE_OVERLAP_PLAN_STREAM=1``."""
    name, sep, rest = str(text).partition("=")
    if not sep or not _VARIANT_NAME.match(name):
        raise BadInput("not a variant", where=f"{option} {text}", expected="NAME=FLAGS, NAME in a-z, 0-9 and -, "
                       "e.g. draft-triton='--speculative-draft-attention-backend triton'", found=repr(str(text))[:80])
    try:
        tokens = shlex.split(rest)
    except ValueError as exc:
        raise BadInput("variant flags do not parse", where=f"{option} {text}", found=str(exc)) from None
    env = dict(t.split("=", 1) for t in tokens if _ENV_TOKEN.match(t))
    extra = [t for t in tokens if not _ENV_TOKEN.match(t)]
    if not tokens:
        raise BadInput("a variant changes nothing", where=f"{option} {text}",
                       expected="SGLang flags or KEY=VALUE settings after NAME=", found="nothing")
    return name, {"extra": extra, "env": env}


def variant_key(name: str) -> str:
    """Where a variant's timings sit in a plan record: ``metrics.variants.KEY`` (NAME with ``-`` as ``_``)."""
    return str(name).replace("-", "_")


def mem_fraction(cfg: PlanConfig) -> float:
    """Each server's share of the whole GPU: the one given, else 0.8 shared among all the servers launched."""
    if cfg.mem_fraction_static is not None:
        return cfg.mem_fraction_static
    return round(min(0.4, 0.8 / (2 + len(cfg.variants))), 3)


def launch_fraction(cfg: PlanConfig, free: float | None) -> float:
    """The --mem-fraction-static one server gets when ``free`` of the GPU is free as it starts: its share of the
    whole GPU as a fraction of what is free (SGLang reads the fraction against free memory). A fraction given
    with --mem-fraction-static is passed as it is."""
    if cfg.mem_fraction_static is not None:
        return cfg.mem_fraction_static
    return fraction_for_share(mem_fraction(cfg), free, where="each server's share")


def untrained_drafter(target_path: str | Path, out: str | Path, draft_vocab_size: int, seed: int = 0) -> dict:
    """An EAGLE-3 drafter of the target's shape with random weights, in SGLang's layout; what was written."""
    cfg = read_json(Path(target_path) / "config.json", what="target config")
    vocab = int(cfg.get("vocab_size") or 0)
    size = min(int(draft_vocab_size), vocab) if vocab else int(draft_vocab_size)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        dc, _ = read_config(out)
        if dc.hidden_size != int(cfg["hidden_size"]) or dc.vocab_size != vocab or dc.draft_vocab_size != size:
            raise Incompatible("an untrained drafter of another shape is already there", where=str(out),
                               expected=f"hidden {cfg['hidden_size']}, vocab {vocab}, draft vocab {size}",
                               found=f"hidden {dc.hidden_size}, vocab {dc.vocab_size}, draft vocab {dc.draft_vocab_size}",
                               fix="choose another --drafter-out (nothing was changed)")
        return {"path": str(out), "draft_vocab_size": size, "reused": True}
    model = build_drafter_for_target(cfg, size, seed=seed)
    save_drafter(model, out)
    return {"path": str(out), "draft_vocab_size": size, "reused": False, "seed": seed,
            "mapping": f"target token ids 0..{size - 1} (any valid mapping times the same)"}


def _launch_all(cfg: PlanConfig, target_path: str, drafter: str) -> list[dict]:
    """Start the plain server (``port``), the speculative one (``port + 1``) and one per variant (``port + 2``
    on), one after another, each healthy before the next starts and sized from the memory free then
    (``launch_fraction``); the first two healthy or all stopped, a variant that does not start reported."""
    common = dict(model_path=target_path, dtype=cfg.dtype, mem_fraction_static=mem_fraction(cfg),
                  max_total_tokens=cfg.max_total_tokens, cuda_graph_max_bs=cfg.cuda_graph_max_bs,
                  disable_radix_cache=True, disable_prefill_cuda_graph=True, enable_metrics=True,
                  sleep_on_idle=True)
    spec = dict(draft_model_path=drafter, steps=cfg.steps, topk=cfg.topk, draft_tokens=cfg.draft_tokens)
    configs = [LaunchConfig(port=cfg.port, extra=list(cfg.extra), env=dict(cfg.env), **common),
               LaunchConfig(port=cfg.port + 1, extra=list(cfg.extra), env=dict(cfg.env), **spec, **common)]
    for i, v in enumerate(cfg.variants.values()):
        configs.append(LaunchConfig(port=cfg.port + 2 + i, extra=list(cfg.extra) + v["extra"],
                                    env={**cfg.env, **v["env"]}, **spec, **common))
    ready: list[dict] = []
    try:
        for i, c in enumerate(configs):
            c = replace(c, mem_fraction_static=launch_fraction(cfg, free_fraction()))
            d = launch(c, site=cfg.site)
            try:
                ready.append(dict(wait_ready(d, timeout_s=cfg.timeout_s), mem_fraction_static=c.mem_fraction_static))
            except Unavailable as exc:
                if i < 2:
                    ready.append(d)
                    raise
                stop_launched(d)  # a variant whose settings this SGLang refuses is reported, the others timed
                ready.append(dict(d, failed=str(exc), mem_fraction_static=c.mem_fraction_static))
        return ready
    except BaseException:
        for d in ready:
            stop_launched(d)
        raise


def _fixed_ms(requests) -> float:
    """Median per-request time outside decoding (queue, prefill, detokenise, HTTP), in ms."""
    rows = []
    for c in requests:
        s = c.server
        if "prefill_finished_time" in s and "request_finished_ts" in s:
            rows.append(1000 * (c.latency_s - (s["request_finished_ts"] - s["prefill_finished_time"])))
    return stats(rows)["median"] if rows else 0.0


def price(m: dict, new_tokens: int, steps: int) -> dict:
    """Break-even (decode phase and end to end) and the speedup at each accept length of ``ACCEPT_GRID``."""
    step, cycle = m["plain_step_ms"], m["spec_cycle_ms"]
    n = max(int(new_tokens) - 1, 1)
    plain_total = m["plain_fixed_ms"] + n * step
    room = plain_total - m["spec_fixed_ms"]
    out: dict[str, Any] = {"breakeven_len": cycle / step,
                           "breakeven_e2e_len": n * cycle / room if room > 0 else float("inf")}
    p = viability.required_p(out["breakeven_len"], steps)
    if p is not None:
        out["breakeven_p_frac"] = p
    grid = {}
    for a in ACCEPT_GRID:
        if a <= steps + 1:
            grid["a" + f"{a:g}".replace(".", "_")] = viability.request_speedup(m, a, new_tokens)
    out["at_accept"] = grid
    return out


def priced(m: dict, new_tokens: int, steps: int) -> dict:
    """One server pair's timings with their break-even, the speedup at each accept length and the cycle's fixed
    part (the cycle beyond one plain step), added in place."""
    m.update(price(m, new_tokens, steps))
    m["fixed_ms"] = m["spec_cycle_ms"] - m["plain_step_ms"]
    return m


def measure(spec: SGLangClient, plain: SGLangClient, prompts: list[list[int]], cfg: PlanConfig,
            progress: bool) -> tuple[dict, dict]:
    """Both servers on the same prompts, alternating (bench.sglang's passes): timings, spreads."""
    methods = {"sglang": _sglang_method(spec, cfg.max_new_tokens), "sglang_plain": _sglang_method(plain, cfg.max_new_tokens)}
    runs: dict[str, list[Run]] = passes(methods, prompts, cfg.repeats, cfg.warmup, progress)
    req = {k: [c for r in v for c in r.requests] for k, v in runs.items()}
    sp, pl = server_split(req["sglang"]), server_split(req["sglang_plain"])
    if not sp or not pl:
        raise BadInput("the servers report no per-request timestamps", where="--url / --plain-url",
                       expected="servers launched with --enable-metrics (invoke sglang.launch does)",
                       found="meta_info without request_received_ts / prefill_finished_time")
    per_pass = {k: [1000 * sum(c.latency_s for c in r.requests) / max(len(r.requests), 1) for r in v]
                for k, v in runs.items()}
    verify = sum(c.verify_ct or 0 for c in req["sglang"])
    tokens = sum(c.completion_tokens for c in req["sglang"])
    m = {"plain_step_ms": pl["cycle_ms"], "spec_cycle_ms": sp["cycle_ms"],
         "plain_fixed_ms": _fixed_ms(req["sglang_plain"]), "spec_fixed_ms": _fixed_ms(req["sglang"]),
         "untrained_accept_len": tokens / verify if verify else 1.0,
         "plain_prefill_ms": pl["prefill_ms"], "spec_prefill_ms": sp["prefill_ms"],
         "plain_request_ms": stats(per_pass["sglang_plain"])["median"],
         "spec_request_ms": stats(per_pass["sglang"])["median"]}
    steps_each = {k: [1000 * (c.server["request_finished_ts"] - c.server["prefill_finished_time"])
                      / (c.verify_ct or max(c.completion_tokens - 1, 1)) for c in v] for k, v in req.items()}
    spread = {"plain_step_ms": stats(steps_each["sglang_plain"])["range"],
              "spec_cycle_ms": stats(steps_each["sglang"])["range"]}
    return m, spread


def run(cfg: PlanConfig, *, progress: bool = True) -> dict:
    """Launch (or use) the two servers, time them, price every accept length; the servers we started stopped."""
    if cfg.repeats < 1 or cfg.max_new_tokens < 8 or cfg.num_prompts < 1:
        raise BadInput("too little to time", where="--repeats/--max-new-tokens/--num-prompts",
                       expected="repeats >= 1, max new tokens >= 8, prompts >= 1",
                       found=f"{cfg.repeats}/{cfg.max_new_tokens}/{cfg.num_prompts}")
    if (cfg.url is None) != (cfg.plain_url is None):
        raise BadInput("give both running servers or neither", where="--url / --plain-url",
                       expected="both (a plain and an untrained-drafter server of one target), or neither (launch)",
                       found=f"--url {cfg.url}, --plain-url {cfg.plain_url}")
    if cfg.variants and (cfg.url is not None or cfg.drafter_only):
        raise BadInput("variants are servers this task launches", where="--variant",
                       expected="no --url/--plain-url and no --drafter-only beside --variant",
                       found=", ".join(cfg.variants))
    target_path = str(sources.resolve(cfg.target, prepare_missing=False))
    if cfg.drafter_only:
        return write_only(cfg, target_path)
    drafter: dict | None = None
    launched: list[dict] = []
    t0 = time.perf_counter()
    if cfg.url is None:
        out = _drafter_out(cfg)
        if progress:
            print(f"writing an untrained drafter of {cfg.target}'s shape to {out}", flush=True)
        drafter = untrained_drafter(target_path, out, cfg.draft_vocab_size, cfg.seed)
        launched = _launch_all(cfg, target_path, drafter["path"])
        plain_url, url = launched[0]["url"], launched[1]["url"]
    else:
        url, plain_url = cfg.url, cfg.plain_url
    try:
        spec, plain = SGLangClient(url, option="--url"), SGLangClient(plain_url, option="--plain-url")
        info, plain_info = spec.server_info(), plain.server_info()
        sc = check_servers(SGLangBenchConfig(url=url, plain_url=plain_url), info, plain_info, target_path)
        from transformers import AutoTokenizer

        pset = eval_prompts(cfg.prompts, cfg.num_prompts)
        prompts = runsetup.encode(AutoTokenizer.from_pretrained(target_path), pset)
        metrics, spread = measure(spec, plain, prompts, cfg, progress)
        timed_variants, failed = {}, {}
        for (name, v), d in zip(cfg.variants.items(), launched[2:]):
            if d.get("failed"):
                failed[name] = d["failed"]
                continue
            vspec = SGLangClient(d["url"], option=f"--variant {name}")
            check_servers(SGLangBenchConfig(url=d["url"], plain_url=plain_url), vspec.server_info(), plain_info,
                          target_path)
            vm, vspread = measure(vspec, plain, prompts, cfg, progress)
            timed_variants[name] = (vm, vspread)
    finally:
        for d in launched:
            stop_launched(d)
    steps = int(sc["steps"])
    priced(metrics, cfg.max_new_tokens, steps)
    for name, (vm, vspread) in timed_variants.items():
        priced(vm, cfg.max_new_tokens, steps)
        vm["cycle_vs_base_x"] = vm["spec_cycle_ms"] / metrics["spec_cycle_ms"]
        key = variant_key(name)
        metrics.setdefault("variants", {})[key] = vm
        spread.update({f"variants.{key}.{k}": v for k, v in vspread.items()})
    config = {"backend": "sglang", "target": cfg.target, "target_path": target_path, "prompts": cfg.prompts,
              "prompts_manifest": pset.manifest, "num_prompts": cfg.num_prompts, "max_new_tokens": cfg.max_new_tokens,
              "repeats": cfg.repeats, "warmup": cfg.warmup, "steps": steps, "topk": int(sc["topk"]),
              "draft_tokens": int(sc["draft_tokens"]), "draft_vocab_size": cfg.draft_vocab_size, "seed": cfg.seed,
              "untrained_drafter": drafter, "launched": bool(launched), "extra": list(cfg.extra), "env": dict(cfg.env),
              "variants": {n: dict({"extra": v["extra"], "env": v["env"]}, **({"failed": failed[n]} if n in failed else {}))
                           for n, v in cfg.variants.items()},
              "mem_fraction_static": mem_fraction(cfg) if launched else None,
              "launched_mem_fraction_static": [d.get("mem_fraction_static") for d in launched],
              "server_info": summarize_info(info), "plain_server_info": summarize_info(plain_info),
              "wall_s": round(time.perf_counter() - t0, 1)}
    return {"config": config, "metrics": metrics, "spread": spread, "summary": summary(metrics, config)}


def _drafter_out(cfg: PlanConfig) -> str:
    return cfg.drafter_out or str(Path(".eaglekb") / "plan" / (Path(cfg.target).name + "-untrained"))


def write_only(cfg: PlanConfig, target_path: str) -> dict:
    """``--drafter-only``: the untrained drafter written, and the two servers to start for ``--url/--plain-url``."""
    drafter = untrained_drafter(target_path, _drafter_out(cfg), cfg.draft_vocab_size, cfg.seed)
    n = cfg.draft_tokens if cfg.draft_tokens is not None else cfg.steps + 1
    spec = (f"invoke sglang.launch --target {cfg.target} --drafter {drafter['path']} --steps {cfg.steps} "
            f"--topk {cfg.topk} --draft-tokens {n} --port {cfg.port + 1}")
    plain = f"invoke sglang.launch --target {cfg.target} --port {cfg.port}"
    then = (f"invoke plan.sglang --target {cfg.target} --url http://127.0.0.1:{cfg.port + 1} "
            f"--plain-url http://127.0.0.1:{cfg.port} --record NAME")
    return {"config": {"target": cfg.target, "target_path": target_path, "untrained_drafter": drafter},
            "metrics": {}, "spread": {}, "commands": [plain, spec, then],
            "summary": f"untrained drafter of {cfg.target}'s shape in {drafter['path']}; serve it and time it:\n  "
                       + "\n  ".join([plain, spec, then])}


def summary(m: dict, config: dict) -> str:
    shape = f"({config['steps']},{config['topk']},{config['draft_tokens']})"
    at = m["at_accept"]
    best = ", ".join(f"{k[1:].replace('_', '.')} -> {v['speedup_x']:.2f}x" for k, v in list(at.items())[:5])
    return (f"{config['target']} on SGLang {config['server_info'].get('version')}: plain step "
            f"{m['plain_step_ms']:.2f} ms, EAGLE-3 {shape} cycle {m['spec_cycle_ms']:.2f} ms; break-even accept "
            f"{m['breakeven_len']:.2f} (decode), {m['breakeven_e2e_len']:.2f} at {config['max_new_tokens']} new "
            f"tokens; accept {best}"
            + "".join(f"\n  variant {name}: cycle {v['spec_cycle_ms']:.2f} ms ({v['cycle_vs_base_x']:.2f}x the default's), "
                      f"plain step {v['plain_step_ms']:.2f} ms, break-even {v['breakeven_len']:.2f}"
                      for name, v in (m.get("variants") or {}).items())
            + "".join(f"\n  variant {name}: did not start ({v['failed']})"
                      for name, v in (config.get("variants") or {}).items() if v.get("failed")))


def check_plan(metrics: Any, where: str) -> dict:
    """A plan.sglang record's metrics, checked: the four timings ``predict`` needs (one line when absent)."""
    need = ("plain_step_ms", "spec_cycle_ms", "plain_fixed_ms", "spec_fixed_ms")
    if not isinstance(metrics, dict) or not all(isinstance(metrics.get(k), (int, float)) for k in need):
        raise BadInput("not a plan.sglang record", where=where, expected="metrics " + ", ".join(need),
                       found=", ".join(sorted(metrics)) if isinstance(metrics, dict) else type(metrics).__name__,
                       fix="record one first: invoke plan.sglang --target TARGET --record NAME")
    return metrics
