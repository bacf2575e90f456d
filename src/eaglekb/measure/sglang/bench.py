"""SGLang against our engine, in one run: tok/s at batch 1, accept-length and token parity, the split.

Owns the protocol of ``invoke bench.sglang``:

* the prompts are token ids (our chat template, the server's own tokenizer files), sent to the
  server's native ``/generate`` with end-of-sequence ignored, so that every method generates exactly
  ``max_new_tokens`` from the same tokens;
* methods alternate prompt by prompt and the order flips between passes (as ``eaglekb.measure.bench``):
  the speculative server (``--url``), optionally a plain server (``--plain-url``), and optionally our
  engine in this process on the same GPU (plain and, for a speculative server, with the server's
  drafter and its steps, topk and draft tokens);
* SGLang tok/s is per-request wall time at the client (HTTP included, as a user sees it); with
  ``--enable-metrics`` the server's own timestamps split each request into queue, prefill, decode and
  the rest (HTTP, detokenize), and decode / verify count is SGLang's cycle time;
* parity: accept length in SGLang's definition (completion tokens / verify count) for both, and per
  prompt the greedy tokens of every pair of methods compared, each first divergence checked for a
  near tie of the target's top-2 logits (``eaglekb.measure.probe.near_tie``);
* ``concurrency``: ``concurrency`` levels of simultaneous requests against the plain and the speculative
  server, output tok/s per level, the speedup at each and the first level where speculation stops paying.

Knows nothing about the task runner or HTTP (the client ``eaglekb.models.server.SGLangClient`` owns it).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from eaglekb.data.prompts import eval_prompts, set_keys
from eaglekb.engine.generate import Engine, SpecConfig
from eaglekb.engine.timing import PhaseTimer, stats, wall
from eaglekb.io.errors import BadInput, Incompatible
from eaglekb.measure import setup as runsetup
from eaglekb.measure import viability
from eaglekb.measure.sglang import trace as sglang_trace
from eaglekb.measure.probe import near_tie
from eaglekb.measure.sglang.server import summarize_info
from eaglekb.models import sources
from eaglekb.models.server import Completion, SGLangClient


@dataclass
class SGLangBenchConfig:
    url: str = "http://127.0.0.1:30000"
    plain_url: str | None = None
    prompts: list[str] = field(default_factory=lambda: ["gsm8k-eval"])
    num_prompts: int = 4
    max_new_tokens: int = 128
    max_prompt_tokens: int = 512
    repeats: int = 3
    warmup: int = 1
    target: str = "smollm2-135m"
    engine: bool = False  # our engine in this process, on ``device``, same prompts and config
    device: str = "cuda"
    dtype: str = "bfloat16"
    concurrency: list[int] = field(default_factory=list)
    plan: dict | None = None  # a plan.sglang record ({"id", "metrics"}; "variant" when priced with one of its
    # variant servers): the prediction made before training


def spec_of(info: dict) -> dict | None:
    """(steps, topk, draft tokens, drafter) of a speculative server's info; None for a plain server."""
    if not info.get("speculative_algorithm"):
        return None
    return {"algorithm": info.get("speculative_algorithm"), "steps": info.get("speculative_num_steps"),
            "topk": info.get("speculative_eagle_topk"), "draft_tokens": info.get("speculative_num_draft_tokens"),
            "drafter": info.get("speculative_draft_model_path")}


def _same_folder(a: str | None, b: str | None) -> bool:
    return bool(a and b) and os.path.realpath(a) == os.path.realpath(b)


def check_servers(cfg: SGLangBenchConfig, info: dict, plain_info: dict | None, target_path: str | None) -> dict | None:
    """The speculative config, after checking the pair of servers and the target (one line on a mismatch)."""
    spec = spec_of(info)
    if plain_info is not None:
        if spec is None:
            raise BadInput("server has no speculative decoding", where=f"--url {cfg.url}",
                           expected="a server launched with --speculative-algorithm EAGLE3 (beside --plain-url)",
                           found="speculative_algorithm none")
        if spec_of(plain_info) is not None:
            raise BadInput("plain server runs speculative decoding", where=f"--plain-url {cfg.plain_url}",
                           expected="a server without --speculative-algorithm",
                           found=str(plain_info.get("speculative_algorithm")))
        if not _same_folder(info.get("model_path"), plain_info.get("model_path")):
            raise Incompatible("the two servers serve different models", where="--url / --plain-url",
                               expected=str(info.get("model_path")), found=str(plain_info.get("model_path")))
    if target_path is not None and not _same_folder(info.get("model_path"), target_path):
        raise Incompatible("server's model is not the bench's target", where=f"--url {cfg.url} / --target",
                           expected=str(target_path), found=str(info.get("model_path")),
                           fix="launch the server with the prepared target folder, or pass --target that folder")
    return spec


# ----------------------------------------------------------------------------- methods


@dataclass
class Run:
    """One method's outputs in one pass: tokens, seconds, verify counts, and per-prompt token ids."""

    tokens: int = 0
    secs: float = 0.0
    verify: int = 0
    outputs: list[list[int]] = field(default_factory=list)
    requests: list[Completion] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)


def _sglang_method(client: SGLangClient, max_new: int):
    def go(ids: list[int], run: Run) -> None:
        c = client.generate(ids, max_new)
        if c.output_ids is not None and len(c.output_ids) != c.completion_tokens:
            raise BadInput("server returned fewer token ids than it counted", where=client.url + "/generate",
                           expected=str(c.completion_tokens), found=str(len(c.output_ids)))
        run.tokens += c.completion_tokens
        run.secs += c.latency_s
        run.verify += c.verify_ct or 0
        run.outputs.append(list(c.output_ids or []))
        run.requests.append(c)
    return go


def _engine_methods(engine, spec_cfg, max_new: int, device: str) -> dict:

    def plain(ids: list[int], run: Run) -> None:
        t0 = wall(device)
        out = engine.generate(ids, max_new)
        run.secs += wall(device) - t0
        run.tokens += len(out.tokens)
        run.outputs.append(list(out.tokens))

    def spec(ids: list[int], run: Run) -> None:
        t0 = wall(device)
        out = engine.speculative(ids, max_new, spec_cfg, timer=PhaseTimer(engine.device))
        run.secs += wall(device) - t0
        run.tokens += len(out.tokens)
        run.verify += out.cycles
        run.outputs.append(list(out.tokens))
        for k, v in out.times.items():
            run.phases[k] = run.phases.get(k, 0.0) + v

    return {"engine": plain, "engine_spec": spec} if spec_cfg is not None else {"engine": plain}


def passes(methods: dict, prompts: list[list[int]], repeats: int, warmup: int, progress: bool) -> dict[str, list[Run]]:
    """Warm-up (every prompt once per method), then ``repeats`` passes, methods alternated prompt by prompt, the order flipped each pass."""
    from tqdm.auto import tqdm

    names = list(methods)
    for _ in range(warmup):  # every prompt: a prompt length the engine has not met costs a one-off compile
        for ids in prompts:
            for n in names:
                methods[n](ids, Run())
    runs: dict[str, list[Run]] = {n: [] for n in names}
    bar = tqdm(total=repeats * len(prompts) * len(names), desc="bench.sglang", disable=not progress, leave=False)
    for rep in range(repeats):
        cur = {n: Run() for n in names}
        order = names if rep % 2 == 0 else names[::-1]
        for ids in prompts:
            for n in order:
                methods[n](ids, cur[n])
                bar.update(1)
        for n in names:
            runs[n].append(cur[n])
    bar.close()
    return runs


# ----------------------------------------------------------------------------- metrics


def _median(values: list[float]) -> tuple[float, float]:
    st = stats(values)
    return st["median"], st["range"]


def server_split(requests: list[Completion]) -> dict:
    """Median ms per request stage from the server's timestamps (``--enable-metrics``); {} without them."""
    rows = []
    for c in requests:
        s = c.server
        keys = ("request_received_ts", "forward_entry_time", "prefill_finished_time", "request_finished_ts")
        if not all(k in s for k in keys) or c.sent_ts is None:
            return {}
        decode = s["request_finished_ts"] - s["prefill_finished_time"]
        served = s.get("response_sent_to_client_ts", s["request_finished_ts"]) - s["request_received_ts"]
        cycles = c.verify_ct or max(c.completion_tokens - 1, 1)
        rows.append({"queue_ms": 1000 * (s["forward_entry_time"] - s["request_received_ts"]),
                     "prefill_ms": 1000 * (s["prefill_finished_time"] - s["forward_entry_time"]),
                     "decode_ms": 1000 * decode,
                     "finish_ms": 1000 * (served - (s["request_finished_ts"] - s["request_received_ts"])),
                     "http_ms": 1000 * (c.latency_s - served),
                     "cycle_ms": 1000 * decode / cycles,
                     "decode_tok_s": (c.completion_tokens - 1) / decode if decode > 0 else 0.0})
    return {k: stats([r[k] for r in rows])["median"] for k in rows[0]} if rows else {}


def method_metrics(name: str, runs: list[Run]) -> tuple[dict, dict]:
    tps, spread = _median([r.tokens / r.secs for r in runs if r.secs > 0])
    m: dict[str, Any] = {"median_tok_s": tps}
    sp = {f"{name}.median_tok_s": spread}
    if any(r.verify for r in runs):
        acc, acc_sp = _median([r.tokens / r.verify for r in runs if r.verify])
        m["accept_len"] = acc  # SGLang's definition: completion tokens / verify count (bonus included)
        sp[f"{name}.accept_len"] = acc_sp
    reported = [c.reported_accept_len for r in runs for c in r.requests if c.reported_accept_len is not None]
    if reported:
        m["reported_accept_len"] = stats(reported)["median"]
    split = server_split([c for r in runs for c in r.requests])
    if split:
        m["server"] = split
    if any(r.phases for r in runs):
        cycles = max(sum(r.verify for r in runs), 1)
        for k in ("draft", "verify", "overhead"):
            m[f"{k}_ms"] = 1000 * sum(r.phases.get(k, 0.0) for r in runs) / cycles
        m["cycle_ms"] = m["draft_ms"] + m["verify_ms"] + m["overhead_ms"]
    return m, sp


def _divergences(a: list[list[int]], b: list[list[int]]) -> dict[int, int]:
    """prompt index -> index of the first token where two methods' outputs differ (absent: identical)."""
    return {p: next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
            for p, (x, y) in enumerate(zip(a, b)) if x != y}


def parity(runs: dict[str, list[Run]], prompts: list[list[int]], engine=None, dtype: str = "bfloat16") -> dict:
    """Token agreement between every pair of methods (first pass); with our engine, each first divergence
    checked for a near tie of the target's top-2 logits (``eaglekb.measure.probe.near_tie``)."""
    first = {n: r[0].outputs for n, r in runs.items()}
    out: dict[str, Any] = {}
    names = list(first)
    ties: dict[tuple, bool] = {}  # (prompt, shared prefix): one target pass, however many pairs part there

    def tie(p: int, tokens: list[int], idx: int) -> bool:
        key = (p, tuple(tokens[:idx]))
        if key not in ties:
            ties[key] = bool(near_tie(engine.target, prompts[p], tokens, idx, dtype)["near_tie"])
        return ties[key]

    for i, a in enumerate(names):
        for b in names[i + 1:]:
            div = _divergences(first[a], first[b])
            ag: dict[str, Any] = {"prompts_count": len(first[a]), "identical_count": len(first[a]) - len(div)}
            if div:
                ag["first_divergence"] = {f"p{p}_tokens": idx for p, idx in div.items()}
                if engine is not None:
                    ag["near_tie_count"] = sum(tie(p, first[a][p], idx) for p, idx in div.items())
            out[f"{a}_vs_{b}"] = ag
    for n, r in runs.items():  # the same method across passes: greedy should not move
        same = [p.outputs[i] == r[0].outputs[i] for p in r[1:] for i in range(len(p.outputs))]
        out.setdefault("repeat_stable", {})[f"{n}_frac"] = sum(same) / len(same) if same else 1.0
    return out


def ratios(m: dict) -> dict:
    def x(a, b):
        return m[a]["median_tok_s"] / m[b]["median_tok_s"] if a in m and b in m and m[b]["median_tok_s"] else None

    pairs = {"sglang_spec_vs_plain_x": ("sglang", "sglang_plain"), "engine_vs_sglang_plain_x": ("engine", "sglang_plain"),
             "engine_spec_vs_sglang_x": ("engine_spec", "sglang"), "engine_spec_vs_engine_x": ("engine_spec", "engine"),
             "engine_vs_sglang_x": ("engine", "sglang")}
    out = {k: x(*v) for k, v in pairs.items()}
    if "accept_len" in m.get("sglang", {}) and "accept_len" in m.get("engine_spec", {}):
        s, e = m["sglang"]["accept_len"], m["engine_spec"]["accept_len"]
        out["accept_len_diff_pct"] = 100 * (e - s) / s  # ours against SGLang's, same drafter and prompts
    return {k: v for k, v in out.items() if v is not None}


def predicted(plan_metrics: dict, m: dict, new_tokens: int) -> dict:
    """The speedup a plan.sglang record predicted from our engine's accept length, beside the measured one."""
    acc = m.get("engine_spec", {}).get("accept_len")
    if not acc:
        return {}
    p = viability.request_speedup(plan_metrics, acc, new_tokens)
    out = {"predicted_x": p["speedup_x"], "predicted_decode_x": p["decode_speedup_x"]}
    s, pl = m.get("sglang", {}).get("server", {}), m.get("sglang_plain", {}).get("server", {})
    if s.get("decode_tok_s") and pl.get("decode_tok_s"):
        out["sglang_spec_vs_plain_decode_x"] = s["decode_tok_s"] / pl["decode_tok_s"]
        if s.get("cycle_ms") and pl.get("cycle_ms"):
            # the rule fed this run's own step and cycle: its error apart from the drift between the two runs
            out["same_run_decode_x"] = acc * pl["cycle_ms"] / s["cycle_ms"]
            out["same_run_error_pct"] = 100 * (out["sglang_spec_vs_plain_decode_x"] - out["same_run_decode_x"]) \
                / out["same_run_decode_x"]
    measured = ratios(m).get("sglang_spec_vs_plain_x")
    if measured:
        out["prediction_error_pct"] = 100 * (measured - p["speedup_x"]) / p["speedup_x"]
    return out


# ----------------------------------------------------------------------------- concurrency


def level(client: SGLangClient, prompts: list[list[int]], max_new: int, c: int, rounds: int = 2) -> dict:
    """``c`` requests at a time, ``c * rounds`` in all: output tok/s, accept length, mean latency."""
    jobs = [prompts[i % len(prompts)] for i in range(c * rounds)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=c) as pool:
        done = list(pool.map(lambda ids: client.generate(ids, max_new), jobs))
    secs = time.perf_counter() - t0
    tokens = sum(d.completion_tokens for d in done)
    verify = sum(d.verify_ct or 0 for d in done)
    out = {"output_tok_s": tokens / secs, "requests": len(done), "mean_latency_s": sum(d.latency_s for d in done) / len(done)}
    if verify:
        out["accept_len"] = tokens / verify
    return out


def concurrency_sweep(clients: dict[str, SGLangClient], prompts: list[list[int]], max_new: int, levels: list[int],
                      repeats: int, progress: bool) -> tuple[dict, dict]:
    """Every level against every server (warm-up of one level's worth first); medians, speedups, where it stops paying."""
    from tqdm.auto import tqdm

    metrics: dict[str, Any] = {}
    spread: dict[str, float] = {}
    bar = tqdm(total=len(levels) * len(clients) * repeats, desc="concurrency", disable=not progress, leave=False)
    for c in levels:
        row: dict[str, Any] = {}
        for name, client in clients.items():
            level(client, prompts, max_new, c, rounds=1)  # warm-up: graphs for this batch size, caches
            reps = []
            for _ in range(repeats):
                reps.append(level(client, prompts, max_new, c))
                bar.update(1)
            tps, sp = _median([r["output_tok_s"] for r in reps])
            row[name] = {"output_tok_s": tps, "mean_latency_s": stats([r["mean_latency_s"] for r in reps])["median"]}
            if "accept_len" in reps[0]:
                row[name]["accept_len"] = stats([r["accept_len"] for r in reps])["median"]
            spread[f"concurrency.c{c}.{name}.output_tok_s"] = sp
        if "sglang" in row and "sglang_plain" in row:
            row["speedup_x"] = row["sglang"]["output_tok_s"] / row["sglang_plain"]["output_tok_s"]
        metrics[f"c{c}"] = row
    bar.close()
    paying = [c for c in levels if metrics[f"c{c}"].get("speedup_x", 0) >= 1.0]
    stops = next((c for c in levels if metrics[f"c{c}"].get("speedup_x", 1.0) < 1.0), None)
    summary: dict[str, Any] = {"paying_levels_count": len(paying), "levels_count": len(levels)}
    if paying:
        summary["last_paying_level_count"] = max(paying)
    if stops is not None:
        summary["stops_paying_at_count"] = stops  # the first level where speculative output tok/s < plain
    return {"concurrency": metrics, "concurrency_summary": summary}, spread


# ----------------------------------------------------------------------------- run


@dataclass
class SGLangReport:
    config: dict
    metrics: dict
    spread: dict
    summary: str
    manifests: dict


def _load_engine(cfg: SGLangBenchConfig, spec: dict | None, prompts: list[list[int]], loaded):

    sc = SpecConfig(steps=int(spec["steps"]), topk=int(spec["topk"]), draft_tokens=int(spec["draft_tokens"])) \
        if spec else None
    nodes = sc.nodes if sc else 0
    max_len = runsetup.cache_len(prompts, cfg.max_new_tokens, nodes + 4, limit=loaded.target.max_len)
    engine = Engine(loaded.target, loaded.drafter, max_len=max_len, graphs=cfg.device.startswith("cuda"))
    for p in prompts:
        engine.check_fits(len(p), cfg.max_new_tokens, nodes)
    return engine, sc


def run(cfg: SGLangBenchConfig, *, progress: bool = True) -> SGLangReport:
    """The servers (and our engine) on every prompt set; the concurrency sweep when levels are given."""

    if cfg.repeats < 1 or cfg.warmup < 0 or cfg.max_new_tokens < 1:
        raise BadInput("repeats and tokens must be >= 1, warm-up >= 0", where="--repeats/--warmup/--max-new-tokens",
                       found=f"{cfg.repeats}/{cfg.warmup}/{cfg.max_new_tokens}")
    keys = set_keys(cfg.prompts)  # before any request: a prompt file's set keyed by its name, a clash refused here
    if cfg.plan is not None and not cfg.engine:
        raise BadInput("a prediction needs our engine's accept length on the same prompts", where="--plan",
                       expected="--engine beside --plan", found="no --engine")
    sets = {name: eval_prompts(name, cfg.num_prompts) for name in cfg.prompts}  # bad prompts before any server
    client = SGLangClient(cfg.url, option="--url")
    plain = SGLangClient(cfg.plain_url, option="--plain-url") if cfg.plain_url else None
    info = client.server_info()
    plain_info = plain.server_info() if plain else None
    target_path = str(sources.resolve(cfg.target, prepare_missing=False))
    spec = check_servers(cfg, info, plain_info, target_path)
    if cfg.concurrency and plain is None:
        raise BadInput("a concurrency sweep compares two servers", where="--concurrency",
                       expected="--plain-url beside --url", found="no --plain-url")
    loaded = runsetup.load(cfg.target, spec["drafter"] if (spec and cfg.engine) else None, device=cfg.device,
                           dtype=cfg.dtype) if cfg.engine else None
    if loaded is not None:
        tok = loaded.tokenizer
    else:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(target_path)
    encoded = {n: runsetup.encode(tok, s, max_prompt_tokens=cfg.max_prompt_tokens) for n, s in sets.items()}
    engine, sc = _load_engine(cfg, spec, [p for ps in encoded.values() for p in ps], loaded) if loaded else (None, None)
    methods: dict = {"sglang": _sglang_method(client, cfg.max_new_tokens)}
    if plain is not None:
        methods["sglang_plain"] = _sglang_method(plain, cfg.max_new_tokens)
    if engine is not None:
        methods.update(_engine_methods(engine, sc, cfg.max_new_tokens, cfg.device))
    metrics: dict[str, Any] = {}
    spread: dict[str, float] = {}
    for name, prompts in encoded.items():
        runs = passes(methods, prompts, cfg.repeats, cfg.warmup, progress)
        key = keys[name]
        m: dict[str, Any] = {}
        for meth, rs in runs.items():
            m[meth], sp = method_metrics(meth, rs)
            spread.update({f"{key}.{k}": v for k, v in sp.items()})
        m["vs"] = ratios(m)
        if cfg.plan is not None:
            m["vs"].update(predicted(cfg.plan["metrics"], m, cfg.max_new_tokens))
        m["parity"] = parity(runs, prompts, engine, cfg.dtype)
        metrics[key] = m
    if cfg.concurrency:
        first = next(iter(encoded.values()))
        cm, cs = concurrency_sweep({"sglang": client, "sglang_plain": plain}, first, cfg.max_new_tokens,
                                   cfg.concurrency, cfg.repeats, progress)
        metrics.update(cm)
        spread.update(cs)
    config = {"backend": "sglang", "url": cfg.url, "plain_url": cfg.plain_url, "prompts": list(cfg.prompts),
              "num_prompts": cfg.num_prompts, "max_new_tokens": cfg.max_new_tokens, "repeats": cfg.repeats,
              "warmup": cfg.warmup, "target": cfg.target, "target_path": target_path, "engine": cfg.engine,
              "device": cfg.device, "dtype": cfg.dtype, "concurrency": list(cfg.concurrency),
              "server_info": summarize_info(info),  # its speculative_* fields are the config the run used
              "plain_server_info": summarize_info(plain_info) if plain_info else None}
    if cfg.plan is not None:
        config["plan"] = cfg.plan["id"]
        if cfg.plan.get("variant"):
            config["plan_variant"] = cfg.plan["variant"]
    if engine is not None:
        config.update(engine_graphs=engine.graphs, engine_compiled=engine.compiled, engine_fused=engine.fused)
    return SGLangReport(config=config, metrics=metrics, spread=spread, summary=summary(metrics, spec),
                        manifests={n: s.manifest for n, s in sets.items()})


def summary(metrics: dict, spec: dict | None) -> str:
    parts = []
    for name, m in metrics.items():
        if name.startswith("concurrency"):
            continue
        s = m["sglang"]
        txt = f"{name}: SGLang {s['median_tok_s']:.1f} tok/s" + (f", accept {s['accept_len']:.2f}" if "accept_len" in s
                                                                 else "")
        if "sglang_plain" in m:
            txt += f" (plain {m['sglang_plain']['median_tok_s']:.1f})"
        if "engine_spec" in m:
            e = m["engine_spec"]
            txt += f"; engine {e['median_tok_s']:.1f}, accept {e.get('accept_len', float('nan')):.2f}"
        elif "engine" in m:
            txt += f"; engine {m['engine']['median_tok_s']:.1f}"
        parts.append(txt)
    cs = metrics.get("concurrency_summary")
    if cs:
        parts.append(f"EAGLE-3 stops paying at concurrency {cs['stops_paying_at_count']}"
                     if "stops_paying_at_count" in cs else "EAGLE-3 pays at every concurrency level")
    return "; ".join(parts) + (f" [{spec['steps']},{spec['topk']},{spec['draft_tokens']}]" if spec else " [plain]")


def profile_split(url: str, target: str, prompts: str, max_new: int, num_steps: int, out: str) -> dict:
    """One request profiled on the server (GPU split per cycle) and timed by its own timestamps (request split)."""
    from pathlib import Path

    from transformers import AutoTokenizer


    client = SGLangClient(url, option="--url")
    info = client.server_info()
    target_path = str(sources.resolve(target, prepare_missing=False))
    check_servers(SGLangBenchConfig(url=url), info, None, target_path)
    pset = eval_prompts(prompts, 1)
    ids = runsetup.encode(AutoTokenizer.from_pretrained(target_path), pset)[0]
    client.generate(ids, 16)
    trace = sglang_trace.capture(client, ids, max_new, Path(out), num_steps=num_steps)
    gpu = sglang_trace.split(sglang_trace.read_trace(trace))
    timed = [client.generate(ids, max_new) for _ in range(3)]
    metrics: dict[str, Any] = {"gpu": gpu, "request": server_split(timed)}
    acc = [c.accept_len for c in timed if c.accept_len]
    if acc:
        metrics["accept_len"] = stats(acc)["median"]
    config = {"backend": "sglang", "url": url, "target": target, "target_path": target_path, "prompts": prompts,
              "prompts_manifest": pset.manifest, "max_new_tokens": max_new, "num_steps": num_steps,
              "trace": str(trace), "server_info": summarize_info(info)}
    # the profiler slows the host (every launch recorded): trust its GPU times and counts, and the unprofiled cycle
    busy = gpu["verify_gpu_ms"] + gpu["draft_gpu_ms"] + gpu["eager_gpu_ms"]
    metrics["gpu_busy_ms"] = busy
    unprofiled = metrics["request"].get("cycle_ms")
    if unprofiled:
        metrics["host_ms"] = max(unprofiled - busy, 0.0)
    text = (f"SGLang cycle {gpu['cycle_ms']:.2f} ms under the profiler: verify GPU {gpu['verify_gpu_ms']:.2f}, draft GPU "
            f"{gpu['draft_gpu_ms']:.2f}, eager GPU {gpu['eager_gpu_ms']:.2f} ({gpu['eager_launches_count']:.0f} eager "
            f"launches), GPU idle {gpu['gpu_idle_ms']:.2f} ({gpu['cycles_count']} cycles)"
            + (f"; unprofiled {unprofiled:.2f} ms, of which {metrics['host_ms']:.2f} ms is not GPU work"
               if unprofiled else ""))
    return {"metrics": metrics, "config": config, "summary": text}
