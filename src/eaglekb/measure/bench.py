"""`bench`: baseline versus speculative throughput, side by side, with peers.

Owns the measurement protocol: the same prompts for every method in one run,
methods alternated prompt by prompt (so drift and thermal or load changes hit all
of them alike), warm-up kept out of timings, ``repeats`` passes, median and range
of each method's tok/s across passes, and the speculative cycle split into draft,
verify and overhead (CUDA events on a GPU). Every method generates exactly
``max_new_tokens`` (end-of-sequence ignored) so token counts are equal.

Methods:

* ``engine``: the engine's own plain decoding (static cache; CUDA graphs on GPU unless ``graphs="off"``);
* ``spec_sS_kK_nN``: EAGLE-3 in the engine, one per sweep point (steps S, topk K, draft tokens N; ``_pP`` where
  ``min_draft_prob`` ends chains after a draft below P percent, ``drafted_len`` then says how deep they went);
* ``hf_generate``: transformers ``generate`` greedy (dynamic cache);
* ``hf_static_compile`` (CUDA only): ``generate`` with ``cache_implementation="static"``
  and ``torch.compile`` of the forward; a failure (it failed on transformers 5.17
  once) is recorded in ``failures``, not raised;
* ``hf_prompt_lookup``: ``generate(prompt_lookup_num_tokens=...)``.

On CUDA with ``graphs="both"`` the plain decode step and the verify cycle are also timed eager and graphed (F04).

The report names the fastest sweep point on the measured machine (``metrics.best``: steps, topk, draft tokens)
and the SGLang server flags that serve that point (``eaglekb.measure.sglang.config.launch_command``), so a user
serves what was measured; when no point beats plain decoding it says so and gives the plain server command.

Knows nothing about the task runner; ``runbooks/bench.py`` calls ``run``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from eaglekb.data.prompts import eval_prompts
from eaglekb.formats.drafter import not_servable_by_sglang
from eaglekb.measure import setup as runsetup
from eaglekb.measure.sglang.config import LaunchConfig, command_line, launch_command
from eaglekb.engine.generate import Engine, SpecConfig
from eaglekb.engine.timing import PhaseTimer, stats, wall
from eaglekb.engine.profile import profile_engine
from eaglekb.io.errors import BadInput
from eaglekb.io.files import flatten


@dataclass
class BenchConfig:
    """Everything needed to rerun a bench (recorded as the baseline config)."""

    target: str = "smollm2-135m"
    drafter: str | None = runsetup.DEFAULT_DRAFTER
    prompts: str = "gsm8k-eval"
    num_prompts: int = 4
    max_new_tokens: int = 128
    max_prompt_tokens: int = 512
    sweep: list[tuple[int, int, int | None]] = field(default_factory=lambda: [(3, 1, None)])
    repeats: int = 3
    warmup: int = 1
    device: str = "cpu"
    dtype: str = "float32"
    graphs: str = "auto"  # auto: on for CUDA; on; off; both (also time eager vs graphed)
    peers: list[str] = field(default_factory=lambda: ["hf_generate", "hf_prompt_lookup", "hf_static_compile"])
    prompt_lookup_tokens: int = 10
    seed: int = 0
    compile: str = "auto"  # auto: inductor-compiled layers inside the CUDA graphs; on; off
    fused: str = "auto"  # greedy chains and trees as one draft and one verify program per cycle: auto (on with graphs)
    profile: bool = False  # CUDA: kernels per decode / verify / draft step (torch.profiler)
    cpu_step_threads: int = 1  # CPU: threads for the engine's decode / draft / verify steps (0: torch's setting)
    cpu_packed: str = "auto"  # CPU: target steps on packed weight copies: auto (timed per row count), on, off
    cpu_draft_fp16: str = "auto"  # CPU: drafter products on float16 copies of matrices it holds exactly: auto/on/off
    cpu_target_fp16: str = "auto"  # CPU: target steps on float16 copies: auto (timed per row count), on, off
    cpu_draft_int8: str = "off"  # CPU: most drafter products on int8 copies (lossy, acceptance only): auto/on/off
    min_draft_prob: float = 0.0  # every chain point ends after a drafted token below this draft probability (0: never)

    def specs(self) -> list[SpecConfig]:
        return [SpecConfig(steps=s, topk=k, draft_tokens=n, min_draft_prob=self.min_draft_prob)
                for s, k, n in self.sweep]


PEERS = ("hf_generate", "hf_prompt_lookup", "hf_static_compile")


def spec_name(s: SpecConfig) -> str:
    """``spec_sS_kK_nN``, and ``_pP`` (percent) for chains a draft probability ends (``--min-draft-prob``)."""
    return f"spec_s{s.steps}_k{s.topk}_n{s.draft_tokens}" + (f"_p{round(s.min_draft_prob * 100)}" if s.min_draft_prob else "")


def parse_sweep(text: str | None, steps: int | None, topk: int | None, draft_tokens: int | None) -> list[tuple]:
    """``"3,1,4;5,1,6;4,4,16"`` (steps,topk,draft tokens; draft tokens may be empty) or single values."""
    if not text:
        return [(steps or 3, topk or 1, draft_tokens)]
    out = []
    for item in text.split(";"):
        parts = [p.strip() for p in item.split(",")]
        try:
            s, k = int(parts[0]), int(parts[1]) if len(parts) > 1 and parts[1] else 1
            n = int(parts[2]) if len(parts) > 2 and parts[2] else None
        except ValueError:
            raise BadInput("bad sweep point", where="--sweep", expected="steps,topk[,draft_tokens];...",
                           found=repr(item)) from None
        out.append((s, k, n))
    return out


def _hf_runner(hf, max_new: int, device: str, **kw) -> Callable[[list[int]], int]:
    def go(prompt: list[int]) -> int:
        ids = torch.tensor([prompt], device=device)
        with torch.no_grad():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                              min_new_tokens=max_new, do_sample=False, pad_token_id=hf.config.eos_token_id
                              if isinstance(hf.config.eos_token_id, int) else 0, **kw)
        return int(out.shape[1] - ids.shape[1])
    return go


def _static_compile_runner(hf, max_new: int, device: str) -> Callable[[list[int]], int]:
    """``generate`` with a static cache; transformers compiles the decoding forward itself
    (its ``compile_config``) when the cache is static. Wrapping ``forward`` in
    ``torch.compile(mode="reduce-overhead")`` by hand as well fails on transformers 5.17
    ("accessing tensor output of CUDAGraphs that has been overwritten"), so it is not done."""
    return _hf_runner(hf, max_new, device, cache_implementation="static")


@dataclass
class Method:
    name: str
    run: Callable[[list[int]], Any]
    is_spec: bool = False


def _methods(cfg: BenchConfig, loaded, engines: dict, specs: list[SpecConfig], failures: dict) -> list[Method]:
    eng = engines["main"]
    methods = [Method("engine", lambda p: eng.generate(p, cfg.max_new_tokens))]
    for s in specs:
        methods.append(Method(spec_name(s), (lambda s: lambda p: eng.speculative(
            p, cfg.max_new_tokens, s, timer=PhaseTimer(eng.device)))(s), is_spec=True))
    hf, dev = loaded.hf_model, loaded.device
    for peer in cfg.peers:
        if peer not in PEERS:
            raise BadInput("unknown peer", where="--peers", expected=", ".join(PEERS), found=repr(peer))
        if peer == "hf_generate":
            methods.append(Method(peer, _hf_runner(hf, cfg.max_new_tokens, dev)))
        elif peer == "hf_prompt_lookup":
            methods.append(Method(peer, _hf_runner(hf, cfg.max_new_tokens, dev,
                                                   prompt_lookup_num_tokens=cfg.prompt_lookup_tokens)))
        elif peer == "hf_static_compile":
            if not dev.startswith("cuda"):
                failures[peer] = "skipped: CUDA only"
                continue
            methods.append(Method(peer, _static_compile_runner(hf, cfg.max_new_tokens, dev)))
    return methods


def _tokens(out) -> int:
    return out if isinstance(out, int) else len(out.tokens)


# ----------------------------------------------------------------------------- run


@dataclass
class BenchReport:
    config: dict
    prompts_manifest: dict
    metrics: dict
    spread: dict
    failures: dict
    summary: str

    def to_dict(self) -> dict:
        return asdict(self)


def _graphs_modes(cfg: BenchConfig) -> tuple[bool, bool]:
    """(main engine graphed, also measure eager vs graphed)."""
    cuda = cfg.device.startswith("cuda")
    if cfg.graphs not in ("auto", "on", "off", "both"):
        raise BadInput("unknown graphs mode", where="--graphs", expected="auto, on, off or both", found=repr(cfg.graphs))
    main = cuda and cfg.graphs in ("auto", "on", "both")
    return main, cuda and cfg.graphs == "both"


def _check(cfg: BenchConfig) -> list[SpecConfig]:
    if cfg.repeats < 1 or cfg.warmup < 0:
        raise BadInput("repeats must be >= 1 and warm-up >= 0", where="--repeats/--warmup",
                       found=f"{cfg.repeats}/{cfg.warmup}")
    if cfg.cpu_step_threads < 0:
        raise BadInput("thread count must be >= 0", where="--cpu-step-threads", found=str(cfg.cpu_step_threads))
    for option, mode in (("compile", cfg.compile), ("fused", cfg.fused), ("cpu-packed", cfg.cpu_packed),
                         ("cpu-draft-fp16", cfg.cpu_draft_fp16), ("cpu-target-fp16", cfg.cpu_target_fp16),
                         ("cpu-draft-int8", cfg.cpu_draft_int8)):
        if mode not in ("auto", "on", "off"):
            raise BadInput(f"unknown {option} mode", where=f"--{option}", expected="auto, on or off", found=repr(mode))
    specs = cfg.specs()
    unknown = [p for p in cfg.peers if p not in PEERS]
    if unknown:
        raise BadInput("unknown peer", where="--peers", expected=", ".join(PEERS), found=repr(unknown[0]))
    if specs and cfg.drafter is None:
        raise BadInput("speculative methods need a drafter", where="--drafter", found="none")
    runsetup.check_points_before_weights(cfg.drafter, specs)
    return specs


def _flag(mode: str) -> bool | None:
    """An auto/on/off option as the engine takes it: None (auto), True or False."""
    return None if mode == "auto" else mode == "on"


def _warm_up(cfg: BenchConfig, methods: list[Method], prompt: list[int], failures: dict) -> None:
    """Compile, graph capture, caches: not timed. A peer that fails is recorded; our own methods must work."""
    for m in list(methods):
        try:
            for _ in range(cfg.warmup):
                m.run(prompt)
        except Exception as exc:
            if m.name not in PEERS:
                raise
            failures[m.name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}" if str(exc) else type(exc).__name__
            methods.remove(m)


def _timed_passes(cfg: BenchConfig, methods: list[Method], prompts: list[list[int]], progress: bool):
    """``repeats`` passes, methods alternated prompt by prompt; per pass tok/s, cycle split and accept length."""
    from tqdm.auto import tqdm

    per_method: dict[str, list[float]] = {m.name: [] for m in methods}
    cycles: dict[str, dict[str, list[float]]] = {m.name: {} for m in methods if m.is_spec}
    accept: dict[str, list[float]] = {m.name: [] for m in methods if m.is_spec}
    bar = tqdm(total=cfg.repeats * len(prompts) * len(methods), desc="bench", disable=not progress, leave=False)
    for rep in range(cfg.repeats):
        toks = {m.name: 0 for m in methods}
        secs = {m.name: 0.0 for m in methods}
        phases: dict[str, dict[str, float]] = {m.name: {} for m in methods if m.is_spec}
        ncyc = {m.name: 0 for m in methods if m.is_spec}
        acc = {m.name: 0 for m in methods if m.is_spec}
        drafted = {m.name: 0 for m in methods if m.is_spec}
        order = methods if rep % 2 == 0 else methods[::-1]  # alternate the order between passes too
        for p in prompts:
            for m in order:
                t0 = wall(cfg.device)
                out = m.run(p)
                secs[m.name] += wall(cfg.device) - t0
                toks[m.name] += _tokens(out)
                if m.is_spec:
                    for k, v in out.times.items():
                        phases[m.name][k] = phases[m.name].get(k, 0.0) + v
                    ncyc[m.name] += out.cycles
                    acc[m.name] += sum(out.accept_lens)
                    drafted[m.name] += out.drafted
                bar.update(1)
        for m in methods:
            per_method[m.name].append(toks[m.name] / secs[m.name])
            if m.is_spec:
                c = max(ncyc[m.name], 1)
                for k in ("draft", "verify", "overhead"):
                    cycles[m.name].setdefault(f"{k}_ms", []).append(1000 * phases[m.name].get(k, 0.0) / c)
                cycles[m.name].setdefault("cycle_ms", []).append(
                    1000 * sum(phases[m.name].get(k, 0.0) for k in ("draft", "verify", "overhead")) / c)
                accept[m.name].append(acc[m.name] / c)
                if cfg.min_draft_prob:  # how deep the chains a draft probability ended went
                    cycles[m.name].setdefault("drafted_len", []).append(drafted[m.name] / c)
    bar.close()
    return per_method, cycles, accept


def _metrics(per_method, cycles, accept, specs: list[SpecConfig]) -> tuple[dict, dict]:
    metrics: dict[str, Any] = {}
    spread: dict[str, float] = {}
    for name, values in per_method.items():
        st = stats(values)
        metrics[name] = {"median_tok_s": st["median"]}
        spread[f"{name}.median_tok_s"] = st["range"]
        if name in cycles:
            for k, vals in cycles[name].items():
                metrics[name][k] = stats(vals)["median"]
                spread[f"{name}.{k}"] = stats(vals)["range"]
            metrics[name]["accept_len"] = stats(accept[name])["median"]
    base = metrics["engine"]["median_tok_s"]
    for peer, key in (("hf_generate", "vs_hf_generate_x"), ("hf_static_compile", "vs_hf_static_compile_x")):
        ref = metrics.get(peer, {}).get("median_tok_s")
        if ref:
            metrics["engine"][key] = base / ref
    for s in specs:
        m = metrics[spec_name(s)]
        m["vs_engine_x"] = m["median_tok_s"] / base
        for peer, key in (("hf_generate", "vs_hf_generate_x"), ("hf_static_compile", "vs_hf_static_compile_x")):
            ref = metrics.get(peer, {}).get("median_tok_s")
            if ref:
                m[key] = m["median_tok_s"] / ref
    return metrics, spread


def best_point(metrics: dict, specs: list[SpecConfig]) -> SpecConfig | None:
    """The sweep point with the highest median tok/s (the first of equals), or None without a sweep."""
    return max(specs, key=lambda s: metrics[spec_name(s)]["median_tok_s"], default=None)


def serve_best(cfg: BenchConfig, metrics: dict, specs: list[SpecConfig], target_path: str, *,
               unservable: str | None = None) -> dict:
    """``metrics.best`` (the fastest point) and the SGLang launch command serving it on this machine: with the
    drafter when that point beats the engine's plain decoding, else plain (speculation does not pay here). A
    drafter SGLang cannot serve (``unservable``: why, from ``eaglekb.formats.drafter.not_servable_by_sglang``) gets
    no command, only the reason."""
    best = best_point(metrics, specs)
    if best is None:
        return {}
    pays = metrics[spec_name(best)]["vs_engine_x"] > 1.0
    point = {"steps_count": best.steps, "topk_count": best.topk, "draft_tokens_count": best.draft_tokens,
             "vs_engine_x": metrics[spec_name(best)]["vs_engine_x"],
             **({"min_draft_prob_frac": best.min_draft_prob} if best.min_draft_prob else {})}
    if pays and unservable:
        return {"metrics": point, "config": {"method": spec_name(best), "pays": pays, "sglang_flags": None,
                                             "sglang_command": None, "sglang_refusal": unservable}}
    dtype = cfg.dtype if cfg.device.startswith("cuda") else None
    cmd = launch_command(LaunchConfig(model_path=target_path, draft_model_path=cfg.drafter if pays else None,
                                      steps=best.steps, topk=best.topk, draft_tokens=best.draft_tokens, dtype=dtype))
    flags = cmd[cmd.index("--speculative-algorithm"):] if pays else []
    return {"metrics": point, "config": {"method": spec_name(best), "pays": pays, "sglang_flags": command_line(flags),
                                         "sglang_command": command_line(cmd)}}


def _summary(metrics: dict, specs: list[SpecConfig]) -> str:
    base = metrics["engine"]["median_tok_s"]
    best = max((spec_name(s) for s in specs), key=lambda n: metrics[n]["median_tok_s"], default=None)
    summary = f"engine {base:.1f} tok/s"
    if best:
        b = metrics[best]
        summary += (f"; best {best} {b['median_tok_s']:.1f} tok/s ({b['vs_engine_x']:.2f}x engine"
                    + (f", {b['vs_hf_generate_x']:.2f}x hf generate" if "vs_hf_generate_x" in b else "")
                    + (f", {b['vs_hf_static_compile_x']:.2f}x hf static+compile" if "vs_hf_static_compile_x" in b
                       else "") + f"), accept_len {b['accept_len']:.2f}")
    return summary


def run(cfg: BenchConfig, *, progress: bool = True) -> BenchReport:
    """Measure every method on the same prompts, alternating, with warm-up and repeats."""
    specs = _check(cfg)
    graphed, compare_graphs = _graphs_modes(cfg)
    loaded = runsetup.load(cfg.target, cfg.drafter, device=cfg.device, dtype=cfg.dtype)
    pset = eval_prompts(cfg.prompts, cfg.num_prompts)
    prompts = runsetup.encode(loaded.tokenizer, pset, max_prompt_tokens=cfg.max_prompt_tokens)
    nodes = max((s.nodes for s in specs), default=0)
    max_len = runsetup.cache_len(prompts, cfg.max_new_tokens, nodes + 4, limit=loaded.target.max_len)
    started = wall(cfg.device)
    engine = Engine(loaded.target, loaded.drafter, max_len=max_len, graphs=graphed, compile=_flag(cfg.compile),
                    seed=cfg.seed, step_threads=cfg.cpu_step_threads or None, fused=_flag(cfg.fused),
                    cpu_packed=cfg.cpu_packed, cpu_draft_fp16=cfg.cpu_draft_fp16, cpu_target_fp16=cfg.cpu_target_fp16,
                    cpu_draft_int8=cfg.cpu_draft_int8,
                    progress=progress)
    start_s = wall(cfg.device) - started  # engine start: caches, CPU product timing, packed copies
    for p in prompts:
        engine.check_fits(len(p), cfg.max_new_tokens, nodes)
    failures: dict[str, str] = {}
    methods = _methods(cfg, loaded, {"main": engine}, specs, failures)
    _warm_up(cfg, methods, prompts[0], failures)
    metrics, spread = _metrics(*_timed_passes(cfg, methods, prompts, progress), specs)
    metrics["engine"]["start_s"] = start_s
    config = asdict(cfg)
    if not cfg.min_draft_prob:  # the records before the option and those without it: one config
        del config["min_draft_prob"]
    if compare_graphs:
        metrics["graphs"] = eager_vs_graphed(loaded, prompts[0], specs[0] if specs else None, max_len, cfg)
    if graphed:
        metrics["engine"]["capture_s"] = engine.capture_s
        if cfg.profile:
            prof = profile_engine(engine, prompts[0], specs[0] if specs else None)
            config["profile_top_kernels"] = {step: p.pop("top") for step, p in prof.items()}
            metrics["profile"] = prof
    # From the loaded drafter's config (a folder's config.json, or a random:...:p-eagle:K spec's), not the file.
    unservable = not_servable_by_sglang(dict(loaded.drafter.config.extra)) if loaded.drafter is not None else None
    served = serve_best(cfg, metrics, specs, loaded.target_path, unservable=unservable)
    if served:
        metrics["best"], config["best"] = served["metrics"], served["config"]
    config["sweep"] = [[s.steps, s.topk, s.draft_tokens] for s in specs]
    config["graphs_main"] = graphed
    config["compiled_main"] = engine.compiled
    config["fused_chain_main"] = engine.fused
    config["fused_tree_main"] = engine.fused
    config["cpu_step_threads"] = engine.step_threads if engine.device.type == "cpu" else None
    config["cpu_products"] = engine.cpu_products  # the product timed fastest per row count on this CPU
    config.update(packed_config(engine))
    config["torch_threads"] = torch.get_num_threads()
    config["max_len"] = max_len
    return BenchReport(config=config, prompts_manifest=pset.manifest, metrics=metrics, spread=spread,
                       failures=failures, summary=_summary(metrics, specs))


def packed_config(engine: Engine) -> dict:
    """The target's and drafter's copies on a CPU engine as recorded: the row counts on packed and on half-width
    copies, the copies' memory, why, and the target step times behind an ``auto`` choice
    (``eaglekb.engine.cpu_packed``)."""
    p, d = engine.cpu_packed, engine.cpu_draft
    out = {"cpu_draft_fp16_matrices": d.matrices, "cpu_draft_fp16_mib": d.mib, "cpu_draft_fp16_why": d.why,
           "cpu_draft_int8_matrices": d.int8_matrices, "cpu_draft_int8_mib": d.int8_mib} \
        if d is not None else {"cpu_draft_fp16_matrices": None}
    if p is None:
        return dict(out, cpu_packed_rows=None, cpu_packed_mib=None)
    return dict(out, cpu_packed_rows=p.rows, cpu_packed_mib=p.mib, cpu_packed_why=p.why, cpu_packed_step_ms=p.step_ms,
                cpu_target_fp16_rows=p.fp16_rows, cpu_target_fp16_mib=p.fp16_mib)


def eager_vs_graphed(loaded, prompt: list[int], spec: SpecConfig | None, max_len: int, cfg: BenchConfig) -> dict:
    """Per-step times of the plain decode and the speculative cycle: eager, CUDA-graphed named steps
    (``graphed``) and, for a greedy chain or tree, the graphed fused cycle (``fused``, the engine's default)."""
    out: dict[str, Any] = {}
    modes = [("eager", False, False), ("graphed", True, False)]
    if spec is not None and spec.temperature <= 0:
        modes.append(("fused", True, True))
    for mode, flag, fused in modes:
        eng = Engine(loaded.target, loaded.drafter, max_len=max_len, graphs=flag,
                     compile=_flag(cfg.compile) if flag else False, seed=cfg.seed, fused=fused)
        for _ in range(2):  # warm-up and capture
            eng.generate(prompt, 16)
            if spec is not None:
                eng.speculative(prompt, 16, spec)
        t = PhaseTimer(eng.device)
        r = eng.generate(prompt, cfg.max_new_tokens, timer=t)
        entry = {"decode_step_ms": 1000 * r.times.get("decode", 0.0) / max(len(r.tokens) - 1, 1)}
        if spec is not None:
            s = eng.speculative(prompt, cfg.max_new_tokens, spec, timer=PhaseTimer(eng.device))
            c = max(s.cycles, 1)
            entry.update({k + "_ms": 1000 * s.times.get(k, 0.0) / c for k in ("draft", "verify", "overhead")})
            entry["cycle_ms"] = sum(entry[k + "_ms"] for k in ("draft", "verify", "overhead"))
            entry["verify_vs_decode_x"] = entry["verify_ms"] / entry["decode_step_ms"]
        out[mode] = entry
    if spec is not None:
        out["verify_eager_vs_graphed_x"] = out["eager"]["verify_ms"] / out["graphed"]["verify_ms"]
    return out


def render_text(r: BenchReport) -> str:
    lines = [f"bench {r.config['target']} on {r.config['device']} {r.config['dtype']}, "
             f"{r.prompts_manifest.get('count')} prompts x {r.config['max_new_tokens']} new tokens, "
             f"{r.config['repeats']} repeats (median, range)"]
    for name, m in r.metrics.items():
        if name in ("graphs", "profile", "best") or "median_tok_s" not in m:
            continue
        line = f"  {name:<28} {m['median_tok_s']:8.2f} tok/s  (range {r.spread.get(name + '.median_tok_s', 0):.2f})"
        if "cycle_ms" in m:
            line += (f"  accept_len {m['accept_len']:.2f}  cycle {m['cycle_ms']:.2f} ms = draft {m['draft_ms']:.2f}"
                     f" + verify {m['verify_ms']:.2f} + overhead {m['overhead_ms']:.2f}  {m['vs_engine_x']:.2f}x engine")
            if "vs_hf_generate_x" in m:
                line += f", {m['vs_hf_generate_x']:.2f}x hf"
        lines.append(line)
    if "graphs" in r.metrics:
        g = r.metrics["graphs"]
        for mode in ("eager", "graphed", "fused"):
            if mode in g:
                lines.append(f"  {mode}: " + ", ".join(f"{k} {v:.3f}" for k, v in g[mode].items()))
    for step, p in r.metrics.get("profile", {}).items():
        kinds = ", ".join(f"{k[:-3]} {v:.3f}" for k, v in p["by_kind"].items())
        lines.append(f"  profile {step}: {p['kernels_count']:.0f} kernels, {p['kernel_ms']:.3f} ms in kernels, "
                     f"{p['wall_ms']:.3f} ms wall per replay ({kinds})")
        for top in r.config.get("profile_top_kernels", {}).get(step, [])[:5]:
            lines.append(f"      {top}")
    c = r.config
    if c.get("cpu_packed_rows") is not None:
        lines.append(f"  engine start {r.metrics['engine']['start_s']:.1f} s; packed products ({c['cpu_packed']}): "
                     f"rows {c['cpu_packed_rows'] or 'none'}, {c['cpu_packed_mib']:.0f} MiB of copies "
                     f"({c['cpu_packed_why']})")
    if c.get("cpu_target_fp16_rows") is not None:
        lines.append(f"  target half-width copies ({c['cpu_target_fp16']}): "
                     f"rows {c['cpu_target_fp16_rows'] or 'none'}, {c['cpu_target_fp16_mib']:.0f} MiB")
    if c.get("cpu_draft_fp16_matrices") is not None:
        lines.append(f"  drafter half-width copies ({c['cpu_draft_fp16']}): {c['cpu_draft_fp16_matrices']} matrices, "
                     f"{c['cpu_draft_fp16_mib']:.0f} MiB ({c['cpu_draft_fp16_why']})")
    if c.get("cpu_draft_int8_matrices"):
        lines.append(f"  drafter int8 copies ({c['cpu_draft_int8']}): {c['cpu_draft_int8_matrices']} matrices, "
                     f"{c['cpu_draft_int8_mib']:.0f} MiB")
    for k, v in r.failures.items():
        lines.append(f"  {k}: not measured ({v})")
    best = r.config.get("best")
    if best:
        b = r.metrics["best"]
        stop = f", ending after a draft below probability {b['min_draft_prob_frac']}" if "min_draft_prob_frac" in b else ""
        lines.append(f"best on this machine: steps {b['steps_count']}, topk {b['topk_count']}, draft tokens "
                     f"{b['draft_tokens_count']}{stop} ({b['vs_engine_x']:.2f}x the engine)")
        if stop and best["pays"] and not best.get("sglang_refusal"):
            lines.append("  SGLang has no draft-probability stop: the flags below draft every step")
        if best.get("sglang_refusal"):
            lines.append(f"  SGLang cannot serve it: {best['sglang_refusal']}")
        elif best["pays"]:
            lines.append(f"  SGLang flags: {best['sglang_flags']}")
        else:
            lines.append("  no sweep point beats plain decoding here: serve without speculation")
        if best["sglang_command"]:
            lines.append(f"  serve it: {best['sglang_command']}")
    lines.append(r.summary)
    return "\n".join(lines)


def noise(r: BenchReport) -> dict:
    """Range over repeats per metric; comparisons allow 25% (throughput on shared machines moves)."""
    paths = set(flatten(r.metrics))
    return {"repeats": r.config["repeats"], "spread_kind": "range",
            "spread": {k: v for k, v in r.spread.items() if k in paths}, "tolerance_rel": 0.25}
