"""`probe`: how well a drafter serves a target, offline and online, and whether it pays.

Owns:

* ``teacher_forced`` (offline): one target pass over prompt + the target's own
  greedy response, then the drafter chain run teacher-forced at every response
  position (step s reads the true token and the drafter's own hidden from step
  s-1, exactly as at inference when earlier drafts were right). Per-step
  acceptance (``acc``: step s right; ``full_acc``: steps 1..s all right, the
  chain's reach) and the simulated accept length ``1 + sum_s full_acc_s`` (bonus
  included; SpecForge's ``simulated_acc_len`` is this minus 1); and the share of the
  target's own response tokens that the draft vocabulary holds (``in_draft_vocab_frac``):
  the ceiling of step 1's acceptance, which no training lifts past it.
* online: real speculative decoding with the engine on held-out prompts: accept
  length per cycle (bonus included, SGLang's ``completion_tokens / verify_ct``), its
  histogram, acceptance per draft depth, exactness against the engine's plain
  greedy output (float32: every prompt must match; bf16/fp16: the share that does,
  and for each divergence whether the target's top-2 logits were a near tie).
* the verdict through ``viability.plan`` with the baseline tok/s and cycle time
  measured in the same run (or given): below break-even is "not viable" however far
  above 1.0 the accept length is; with a reference drafter, better or worse than it.

Knows nothing about the task runner; ``runbooks/probe.py`` calls ``run`` and records.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from eaglekb.data.prompts import eval_prompts
from eaglekb.measure import setup as runsetup
from eaglekb.measure import viability
from eaglekb.engine.draft import DraftModel
from eaglekb.engine.generate import Engine, SpecConfig
from eaglekb.engine.kv import causal_rows
from eaglekb.engine.model import TargetModel
from eaglekb.engine.timing import PhaseTimer
from eaglekb.io.files import flatten
from eaglekb.io.errors import BadInput
from eaglekb.io.progress import still_working


@dataclass
class ProbeConfig:
    """Everything needed to rerun a probe (recorded as the baseline config)."""

    target: str = "smollm2-135m"
    drafter: str | None = runsetup.DEFAULT_DRAFTER
    reference_drafter: str | None = None
    prompts: str = "gsm8k-eval"
    num_prompts: int = 8
    max_new_tokens: int = 64
    max_prompt_tokens: int = 512
    steps: int = 3
    topk: int = 1
    draft_tokens: int | None = None
    temperature: float = 0.0
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    graphs: bool = True  # CUDA graphs for decode, draft and verify steps on CUDA (ignored on CPU)
    min_draft_prob: float = 0.0  # a chain ends after a drafted token below this draft probability (0: never)
    baseline_tps: float | None = None  # override the measured baseline for the verdict
    cycle_ms: float | None = None  # override the measured cycle time for the verdict

    def spec(self) -> SpecConfig:
        return SpecConfig(steps=self.steps, topk=self.topk, draft_tokens=self.draft_tokens,
                          temperature=self.temperature, min_draft_prob=self.min_draft_prob)


# ----------------------------------------------------------------------------- offline


def teacher_forced(target: TargetModel, dm: DraftModel, seq: list[int], prompt_len: int, steps: int):
    """Per-root, per-step correctness ``[steps, R]`` (bool) over the response of ``seq``, and whether each step-1
    label (the target's own next token) is in the draft vocabulary ``[R]`` (bool)."""
    preds, labels = teacher_forced_preds(target, dm, seq, prompt_len, steps)
    held = torch.isin(labels[0], (dm.d2t + torch.arange(dm.d2t.numel(), device=dm.d2t.device)).cpu())
    return preds == labels, held


@torch.no_grad()
def teacher_forced_preds(target: TargetModel, dm: DraftModel, seq: list[int], prompt_len: int, steps: int):
    """Drafted tokens and the target's labels, both ``[steps, R]`` (target ids), per root and step.

    Root j (drafter position j, first draft predicts token j+2) ranges over
    ``prompt_len-1 .. len(seq)-1-steps``. The label of step s is the target's own
    argmax at the position before the predicted token. Drafter cache: slot
    ``s*L + j`` holds step s at root j; step s sees block 0 up to j and its own
    chain's earlier steps (same forward as the engine's).
    """
    L = len(seq)
    dev = target.device
    ids = torch.tensor([seq], device=dev)
    ar = torch.arange(L, device=dev)
    kv = target.new_cache(L)
    logits, aux = target(ids, ar, ar, causal_rows(0, L, L, dev), kv)
    g = logits[0].argmax(-1)  # g[j] predicts token j+1
    roots = torch.arange(prompt_len - 1, L - steps, device=dev)
    if roots.numel() == 0:
        empty = torch.zeros(steps, 0, dtype=torch.long)
        return empty, empty.clone()
    dkv = dm.new_cache(steps * L)
    width = steps * L
    n0 = L - 1
    j0 = torch.arange(n0, device=dev)
    mask = torch.zeros(n0, width, dtype=torch.bool, device=dev)
    mask[:, :n0] = causal_rows(0, n0, n0, dev)
    d_logits, hidden = dm(ids[:, 1:], aux[:, :n0], j0, j0, mask, dkv)
    preds, labels = [], []
    pred = dm.to_target(d_logits[0].argmax(-1))
    preds.append(pred[roots])
    labels.append(g[roots + 1])
    for s in range(1, steps):
        n = L - 1 - s
        j = torch.arange(n, device=dev)
        mask = torch.zeros(n, width, dtype=torch.bool, device=dev)
        mask[:, :n0] = causal_rows(0, n, n0, dev)
        for b in range(1, s + 1):
            mask[j, b * L + j] = True
        # P-EAGLE (eaglekb.engine.parallel): mask rows, whatever the earlier steps drafted; EAGLE-3: the chain's own
        step_ids, step_hidden = dm.mask_rows(n) if dm.parallel_tokens else (ids[:, 1 + s:], hidden[:, :n])
        d_logits, hidden = dm(step_ids, step_hidden, j + s, s * L + j, mask, dkv)
        pred = dm.to_target(d_logits[0].argmax(-1))
        preds.append(pred[roots])
        labels.append(g[roots + 1 + s])
    return torch.stack(preds).cpu(), torch.stack(labels).cpu()


def offline_metrics(correct: torch.Tensor, held: torch.Tensor | None = None) -> dict[str, Any]:
    """acc / full_acc per step and the simulated accept length (bonus included); with ``held`` (per root, the
    target's token is in the draft vocabulary) the share the draft vocabulary holds."""
    steps, roots = correct.shape
    if roots == 0:
        raise BadInput("no response positions to probe", where="offline probe",
                       expected="responses longer than the draft steps", found="none")
    full = torch.cumprod(correct.float(), dim=0)
    m: dict[str, Any] = {"positions_count": int(roots)}
    for s in range(steps):
        m[f"acc_step{s + 1}_frac"] = float(correct[s].float().mean())
        m[f"full_acc_step{s + 1}_frac"] = float(full[s].mean())
        if s:
            prev = full[s - 1].sum()
            m[f"cond_acc_step{s + 1}_frac"] = float(full[s].sum() / prev) if prev > 0 else 0.0
    m["simulated_accept_len"] = 1.0 + float(full.sum(0).mean())
    if held is not None:
        m["in_draft_vocab_frac"] = float(held.float().mean())
    return m


# ----------------------------------------------------------------------------- online


@dataclass
class OnlineStats:
    tokens: int = 0
    cycles: int = 0
    accept_lens: list[int] = field(default_factory=list)
    depth_accepts: list[int] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=dict)
    spec_s: float = 0.0
    exact: int = 0
    prompts: int = 0
    divergences: list[dict] = field(default_factory=list)
    drafted: int = 0

    def add(self, res, spec_s: float) -> None:
        self.tokens += len(res.tokens)
        self.cycles += res.cycles
        self.drafted += res.drafted
        self.accept_lens += res.accept_lens
        if not self.depth_accepts:
            self.depth_accepts = [0] * len(res.accepted_per_depth)
        self.depth_accepts = [a + b for a, b in zip(self.depth_accepts, res.accepted_per_depth)]
        for k, v in res.times.items():
            self.times[k] = self.times.get(k, 0.0) + v
        self.spec_s += spec_s


def near_tie(target: TargetModel, prompt: list[int], tokens: list[int], index: int, dtype: str) -> dict:
    """Top-2 margin of the target's logits where speculative and plain output first differ."""
    seq = prompt + tokens[:index]
    dev = target.device
    kv = target.new_cache(len(seq))
    ar = torch.arange(len(seq), device=dev)
    logits, _ = target(torch.tensor([seq], device=dev), ar, ar, causal_rows(0, len(seq), len(seq), dev), kv,
                       last_only=True)
    top = logits[0, -1].float().topk(2).values
    eps = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}.get(dtype, 2.0 ** -24)
    margin = float(top[0] - top[1])
    bound = 4 * eps * float(top.abs().max())  # a few roundings of the largest logit
    return {"index": index, "margin": margin, "rounding_bound": bound, "near_tie": margin <= bound}


def online(engine: Engine, prompts: list[list[int]], cfg: ProbeConfig, eos: tuple[int, ...], *,
           progress: bool = True, label: str = "probe") -> tuple[OnlineStats, float, list[list[int]]]:
    """Plain then speculative decoding per prompt; returns stats, baseline decode tok/s, plain outputs."""
    from tqdm.auto import tqdm

    spec = cfg.spec()
    stats = OnlineStats()
    base_tokens, base_s, outputs = 0, 0.0, []
    # warm-up (kept out of timings; on CUDA it compiles and captures every step shape): a short run of each
    with still_working(f"{label}: warm-up (compiling and capturing the step shapes)", enabled=progress):
        engine.generate(prompts[0], 16)
        engine.speculative(prompts[0], 16, spec)
    for i, p in enumerate(tqdm(prompts, desc=label, disable=not progress, leave=False)):
        engine.seed(cfg.seed + i)
        t = PhaseTimer(engine.device)
        base = engine.generate(p, cfg.max_new_tokens, temperature=cfg.temperature, stop_ids=eos, timer=t)
        base_tokens += max(len(base.tokens) - 1, 0)  # decode rate: tokens after the prefill's
        base_s += base.times.get("decode", 0.0)
        outputs.append(base.tokens)
        engine.seed(cfg.seed + i)
        res = engine.speculative(p, cfg.max_new_tokens, spec, stop_ids=eos, timer=PhaseTimer(engine.device))
        stats.add(res, sum(v for k, v in res.times.items() if k != "prefill"))
        stats.prompts += 1
        if cfg.temperature <= 0:
            if res.tokens == base.tokens:
                stats.exact += 1
            else:
                first = next((k for k, (a, b) in enumerate(zip(res.tokens, base.tokens)) if a != b),
                             min(len(res.tokens), len(base.tokens)))
                d = near_tie(engine.target, p, base.tokens, first, cfg.dtype)
                d["prompt"] = i
                stats.divergences.append(d)
    base_tps = base_tokens / base_s if base_s > 0 else float("nan")
    return stats, base_tps, outputs


def online_metrics(st: OnlineStats, steps: int, *, greedy: bool = True, stopped: bool = False) -> dict[str, Any]:
    """The online run's metrics; ``stopped`` (--min-draft-prob): also the draft tokens verified per cycle."""
    cyc = max(st.cycles, 1)
    hist = {f"len{k}_count": st.accept_lens.count(k) for k in range(1, steps + 2)}
    m: dict[str, Any] = {
        "accept_len": sum(st.accept_lens) / cyc,
        "cycles_count": st.cycles,
        "new_tokens": st.tokens,
        "accept_len_hist": hist,
        "depth_accept": {f"depth{d + 1}_frac": a / cyc for d, a in enumerate(st.depth_accepts)},
        "cycle_ms": 1000 * sum(st.times.get(k, 0.0) for k in ("draft", "verify", "overhead")) / cyc,
        "draft_ms": 1000 * st.times.get("draft", 0.0) / cyc,
        "verify_ms": 1000 * st.times.get("verify", 0.0) / cyc,
        "overhead_ms": 1000 * st.times.get("overhead", 0.0) / cyc,
        # decode rate, prefill excluded (as the baseline's): tokens after the prefill's / cycle time
        "spec_tok_s": (st.tokens - st.prompts) / st.spec_s if st.spec_s > 0 else 0.0,
    }
    if stopped:  # chains a draft probability ended: how deep they went
        m["drafted_len"] = st.drafted / cyc  # draft tokens verified a cycle
    if st.prompts and greedy:  # sampled runs have no single right answer to match
        m["exact_match_frac"] = st.exact / st.prompts
        m["divergent_prompts_count"] = len(st.divergences)
        m["divergences_near_tie_count"] = sum(d["near_tie"] for d in st.divergences)
    return m


# ----------------------------------------------------------------------------- run


@dataclass
class ProbeReport:
    config: dict
    prompts_manifest: dict
    metrics: dict
    verdict: dict
    summary: str
    divergences: list[dict]

    def to_dict(self) -> dict:
        return asdict(self)


def _probe_one(engine: Engine, dm: DraftModel, prompts, cfg: ProbeConfig, eos, progress: bool, label: str):
    stats, base_tps, outputs = online(engine, prompts, cfg, eos, progress=progress, label=f"{label} online")
    with still_working(f"{label}: offline acceptance (teacher-forced, {len(prompts)} prompts)", enabled=progress):
        parts = [teacher_forced(engine.target, dm, p + o, len(p), cfg.steps) for p, o in zip(prompts, outputs)]
    correct, held = torch.cat([c for c, _ in parts], dim=1), torch.cat([h for _, h in parts])
    return (online_metrics(stats, cfg.steps, greedy=cfg.temperature <= 0, stopped=cfg.min_draft_prob > 0),
            offline_metrics(correct, held), base_tps,
            stats)


def run(cfg: ProbeConfig, *, progress: bool = True) -> ProbeReport:
    """Load, probe the drafter (and the reference), and judge it against break-even."""
    if cfg.drafter is None:
        raise BadInput("no drafter", where="--drafter", expected="a drafter folder", found="none")
    spec = cfg.spec()  # validates steps/topk/draft tokens before loading anything
    runsetup.check_points_before_weights(cfg.drafter, [spec])  # and what a P-EAGLE drafter can draft
    pset = eval_prompts(cfg.prompts, cfg.num_prompts)  # a bad prompt set is refused before the model loads
    with still_working(f"loading {cfg.target} and the drafter", enabled=progress):
        loaded = runsetup.load(cfg.target, cfg.drafter, reference=cfg.reference_drafter, device=cfg.device,
                               dtype=cfg.dtype)
    prompts = runsetup.encode(loaded.tokenizer, pset, max_prompt_tokens=cfg.max_prompt_tokens)
    max_len = runsetup.cache_len(prompts, cfg.max_new_tokens, spec.draft_tokens, limit=loaded.target.max_len)
    graphs = cfg.graphs and cfg.device.startswith("cuda")
    # the drafter as trained: int8 copies would measure their rounding, not the checkpoint (half-width ones are exact)
    engine = Engine(loaded.target, loaded.drafter, max_len=max_len, seed=cfg.seed, graphs=graphs, cpu_draft_int8="off")
    for p in prompts:
        engine.check_fits(len(p), cfg.max_new_tokens, spec.nodes)
    online_m, offline_m, base_tps, stats = _probe_one(engine, loaded.drafter, prompts, cfg, loaded.eos_ids,
                                                      progress, "drafter")
    metrics: dict[str, Any] = {"online": online_m, "offline": offline_m, "baseline_tok_s": base_tps}
    baseline = cfg.baseline_tps or base_tps
    cycle = cfg.cycle_ms or online_m["cycle_ms"]
    report = viability.plan(baseline_tok_s=baseline, cycle_ms=cycle, accept_len=max(online_m["accept_len"], 1.0),
                            steps=cfg.steps, topk=cfg.topk, draft_tokens=spec.draft_tokens)
    metrics["breakeven_len"] = report.breakeven_len
    metrics["predicted_speedup_x"] = report.speedup_x
    metrics["measured_speedup_x"] = online_m["spec_tok_s"] / base_tps if base_tps > 0 else 0.0
    measured = metrics["measured_speedup_x"] if base_tps > 0 and cfg.baseline_tps is None and cfg.cycle_ms is None \
        else None
    viable, word = viability.verdict_text(bool(report.viable), measured)
    verdict: dict[str, Any] = {
        "viable": viable,
        "predicted_viable": bool(report.viable),
        "measured_speedup_x": measured,
        "word": word,
        "breakeven_len": report.breakeven_len,
        "accept_len": online_m["accept_len"],
        "baseline_tok_s": baseline,
        "cycle_ms": cycle,
        "baseline_measured": cfg.baseline_tps is None,
        "cycle_measured": cfg.cycle_ms is None,
    }
    if loaded.reference is not None:
        ref_engine = Engine(loaded.target, loaded.reference, max_len=max_len, seed=cfg.seed, graphs=graphs,
                            cpu_draft_int8="off")
        r_on, r_off, _, _ = _probe_one(ref_engine, loaded.reference, prompts, cfg, loaded.eos_ids, progress,
                                       "reference")
        metrics["reference"] = {"online": r_on, "offline": r_off}
        verdict["reference_accept_len"] = r_on["accept_len"]
        verdict["vs_reference"] = "better" if online_m["accept_len"] > r_on["accept_len"] else (
            "equal" if online_m["accept_len"] == r_on["accept_len"] else "worse")
        metrics["vs_reference_x"] = online_m["accept_len"] / r_on["accept_len"] if r_on["accept_len"] else 0.0
    summary = _summary(verdict, online_m, offline_m, cfg)
    config = asdict(cfg)
    if not cfg.min_draft_prob:  # the records before the option and those without it: one config
        del config["min_draft_prob"]
    config["draft_tokens"] = spec.draft_tokens
    config["capture_points"] = loaded.capture_points
    return ProbeReport(config=config, prompts_manifest=pset.manifest, metrics=metrics, verdict=verdict,
                       summary=summary, divergences=stats.divergences)


def _summary(verdict: dict, on: dict, off: dict, cfg: ProbeConfig) -> str:
    word = verdict.get("word") or viability.verdict_text(verdict["viable"], verdict.get("measured_speedup_x"))[1]
    s = (f"accept_len {on['accept_len']:.2f} online (simulated {off['simulated_accept_len']:.2f}) vs break-even "
         f"{verdict['breakeven_len']:.2f} at {verdict['cycle_ms']:.1f} ms/cycle and {verdict['baseline_tok_s']:.1f} "
         f"tok/s: {word}")
    if "vs_reference" in verdict:
        s += f"; {verdict['vs_reference']} than the reference ({verdict['reference_accept_len']:.2f})"
    if cfg.temperature <= 0 and "exact_match_frac" in on:
        s += f"; exact on {100 * on['exact_match_frac']:.0f}% of prompts"
    return s


def render_text(r: ProbeReport) -> str:
    on, off = r.metrics["online"], r.metrics["offline"]
    lines = [
        f"target {r.config['target']}  drafter {r.config['drafter']}  steps/topk/draft tokens "
        f"{r.config['steps']}/{r.config['topk']}/{r.config['draft_tokens']}  T={r.config['temperature']:g}  "
        f"{r.config['device']} {r.config['dtype']}  prompts {r.prompts_manifest.get('count')} ({r.config['prompts']})",
        f"offline (teacher-forced): simulated accept_len {off['simulated_accept_len']:.3f}; per step acc "
        + ", ".join(f"{off[f'acc_step{s}_frac']:.3f}" for s in range(1, r.config["steps"] + 1))
        + "; full " + ", ".join(f"{off[f'full_acc_step{s}_frac']:.3f}" for s in range(1, r.config["steps"] + 1))
        + (f"; the draft vocabulary holds {100 * off['in_draft_vocab_frac']:.1f}% of the target's tokens here"
           if "in_draft_vocab_frac" in off else ""),
        f"online: accept_len {on['accept_len']:.3f} over {on['cycles_count']} cycles; histogram "
        + " ".join(f"{k[3:-6]}:{v}" for k, v in on["accept_len_hist"].items())
        + "; per depth " + ", ".join(f"{v:.3f}" for v in on["depth_accept"].values()),
        f"timing: baseline {r.metrics['baseline_tok_s']:.1f} tok/s, speculative {on['spec_tok_s']:.1f} tok/s "
        f"({r.metrics['measured_speedup_x']:.2f}x); cycle {on['cycle_ms']:.2f} ms = draft {on['draft_ms']:.2f} + "
        f"verify {on['verify_ms']:.2f} + overhead {on['overhead_ms']:.2f}",
    ]
    if "exact_match_frac" in on:
        lines.append(f"exactness vs plain greedy: {100 * on['exact_match_frac']:.0f}% of prompts identical"
                     + (f"; {on['divergent_prompts_count']} divergent, {on['divergences_near_tie_count']} at near ties"
                        if on["divergent_prompts_count"] else ""))
    lines.append("verdict: " + r.summary)
    return "\n".join(lines)


#: accept lengths are deterministic for greedy float32 runs; timings move with the machine.
def noise(metrics: dict) -> dict:
    """Acceptance is deterministic under greedy decoding (2%); timings, and break-even, which is
    baseline tok/s x cycle time, move with machine load (50%)."""
    tol = {}
    for path, value in flatten(metrics).items():
        if path.endswith(("_tok_s", "_ms", "_x")) or path == "breakeven_len":
            tol[path] = abs(float(value)) * 0.5 + 1e-9
    return {"repeats": 1, "spread_kind": "none", "tolerance_rel": 0.02, "tolerance_abs": tol}
