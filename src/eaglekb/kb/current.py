"""The current view: for each setup, the newest result that nothing supersedes.

Owns: the key of a measured probe or bench result (``setup``: target and drafter by content hash, prompt
set by its manifest hash, machine, config, and the shape: chain, tree, or plain decoding without a
drafter), one row per key holding the newest result on it (``view``; a bench gives a plain row for its
engine and peers, and a chain and a tree row for its best speculative point of each shape), which
baselines are superseded (``superseded``: marked ``superseded_by``, or older than the newest result
on their key), the headline numbers of a row, and the view as a Markdown table (``table``). Cited
reports (source "recorded") are not in the view: nothing here re-measures them, so only their own
``superseded_by`` retires them.

Knows nothing about MkDocs or the task runner: the docs hooks render it and knowledge.json carries it.
"""

from __future__ import annotations

import json
from typing import Any

from eaglekb.io.files import flatten
from eaglekb.kb import render
from eaglekb.kb.schema import Baseline

KINDS = ("probe", "bench")
#: Config fields that belong to a probe's setup (beyond target, drafter, prompts and machine).
PROBE_CONFIG = ("dtype", "steps", "topk", "draft_tokens", "temperature", "num_prompts", "max_new_tokens")
BENCH_CONFIG = ("dtype", "num_prompts", "max_new_tokens")
#: Engine settings that change a bench run's speed, keyed only where a record has them (older records lack them).
BENCH_SETTINGS = ("cpu_packed", "cpu_draft_fp16", "cpu_target_fp16", "cpu_draft_int8")
PLAIN_METRICS = ("engine.median_tok_s", "hf_static_compile.median_tok_s", "hf_generate.median_tok_s")


def _identity(b: Baseline, *keys: str) -> dict[str, Any] | None:
    """The first of KEYS (dotted config paths) that names an input: its path and sha256."""
    for key in keys:
        node: Any = b.config
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, str):
            entry = (b.provenance.inputs or {}).get(key)
            return {"path": node, "sha256": entry.sha256 if entry else None}
    return None


def _prompts(b: Baseline, name: str | None = None) -> dict[str, Any]:
    manifest = b.config.get("prompts_manifest")
    if name is not None and isinstance(manifest, dict):  # one manifest per prompt set (bench.sglang)
        manifest = manifest.get(name)
    sha = manifest.get("sha256") if isinstance(manifest, dict) else None
    return {"name": name or str(b.config.get("prompts")), "sha256": sha}


def machine(b: Baseline) -> str:
    """Where a result ran: the GPU model for a CUDA run, the CPU model and core count otherwise."""
    host = b.provenance.host
    if str(b.config.get("device", "")).startswith("cuda") or (b.config.get("backend") == "sglang" and host.gpus):
        return str(host.gpus[0].get("name", "GPU")) if host.gpus else "GPU (not recorded)"
    cores = f", {host.cpu_count} cores" if host.cpu_count else ""
    return f"CPU: {host.cpu or 'model not recorded'}{cores}"


def _flat(b: Baseline) -> dict[str, Any]:
    return flatten(b.metrics)


def _row(b: Baseline, shape: str, config: dict[str, Any], metrics: dict[str, float],
         drafter: bool = True, prompts: str | None = None) -> dict[str, Any]:
    return {"kind": b.kind, "shape": shape, "target": _identity(b, "target", "model"),
            "drafter": _identity(b, "drafter", "server_info.speculative_draft_model_path") if drafter else None,
            "prompts": _prompts(b, prompts),
            "machine": machine(b), "config": config, "baseline": b.id, "created_at": b.created_at,
            "metrics": metrics, "reproduce": b.provenance.reproduce}


def _probe_rows(b: Baseline) -> list[dict[str, Any]]:
    flat = _flat(b)
    if "online.accept_len" not in flat:
        return []
    config = {k: b.config.get(k) for k in PROBE_CONFIG}
    shape = "chain" if (b.config.get("topk") or 1) == 1 else "tree"
    keep = ("online.accept_len", "breakeven_len", "measured_speedup_x", "online.cycle_ms", "online.spec_tok_s",
            "baseline_tok_s")
    return [_row(b, shape, config, {k: flat[k] for k in keep if k in flat})]


SGLANG_METRICS = ("sglang.median_tok_s", "sglang.accept_len", "sglang_plain.median_tok_s",
                  "engine_spec.median_tok_s", "engine_spec.accept_len", "engine.median_tok_s")


SGLANG_SETTINGS = ("attention_backend", "speculative_draft_attention_backend", "speculative_attention_mode",
                   "disable_overlap_schedule")


def _sglang_rows(b: Baseline) -> list[dict[str, Any]]:
    """A served run (bench.sglang): one row per prompt set, single stream, the server's setup as its config."""
    info = b.config.get("server_info") or {}
    state = info.get("internal_state") or {}
    settings = {k: info.get(k, state.get(k)) for k in SGLANG_SETTINGS}
    config = {"backend": "sglang", **{k: b.config.get(k) for k in BENCH_CONFIG},
              **{k: info.get(f"speculative_{k}") for k in ("num_steps", "eagle_topk", "num_draft_tokens")},
              "cuda_graph": not info.get("disable_cuda_graph"), "concurrency": b.config.get("concurrency") or None,
              # the server settings that change its speed: a run with another draft attention backend or scheduler
              # is another setup, not a newer result of the same one
              **{k: v for k, v in settings.items() if v is not None}}
    shape = "chain" if (info.get("speculative_eagle_topk") or 1) == 1 else "tree"
    rows = []
    for key, node in b.metrics.items():
        if isinstance(node, dict) and isinstance(node.get("sglang"), dict) and "median_tok_s" in node["sglang"]:
            flat = flatten(node)
            rows.append(_row(b, shape, dict(config), {f"{key}.{m}": flat[m] for m in SGLANG_METRICS if m in flat},
                             prompts=key.replace("_", "-")))
    return rows


def _bench_rows(b: Baseline) -> list[dict[str, Any]]:
    if b.config.get("backend") == "sglang":
        return _sglang_rows(b)
    flat = _flat(b)
    config = {k: b.config.get(k) for k in BENCH_CONFIG}
    for k in BENCH_SETTINGS:  # a run with the CPU's packed or half-width products on or off is another setup
        if b.config.get(k) is not None:
            config[k] = b.config[k]
    rows = []
    plain = {k: flat[k] for k in PLAIN_METRICS if k in flat}
    if plain:
        rows.append(_row(b, "plain", config, plain, drafter=False))
    points: dict[str, list[str]] = {"chain": [], "tree": []}
    for name, node in b.metrics.items():
        if name.startswith("spec_s") and isinstance(node, dict) and "median_tok_s" in node:
            topk = int(name.split("_k", 1)[1].split("_", 1)[0]) if "_k" in name else 1
            points["chain" if topk == 1 else "tree"].append(name)
    for shape, names in points.items():
        if names:
            best = max(names, key=lambda n: b.metrics[n]["median_tok_s"])
            keep = ("median_tok_s", "vs_engine_x", "accept_len", "cycle_ms", "draft_ms", "verify_ms")
            rows.append(_row(b, shape, dict(config, point=best),
                             {f"{best}.{k}": b.metrics[best][k] for k in keep if k in b.metrics[best]}))
    return rows


def rows_of(b: Baseline) -> list[dict[str, Any]]:
    """The rows one measured probe or bench result contributes (none for other kinds or cited reports)."""
    if b.source != "measured" or b.kind not in KINDS:
        return []
    return _probe_rows(b) if b.kind == "probe" else _bench_rows(b)


def setup(row: dict[str, Any]) -> str:
    """The key of a row: everything but the result (the bench point is a result, not part of the setup)."""
    def ident(x: dict[str, Any] | None) -> Any:
        return None if x is None else (x["sha256"] or f"unknown:{x['path']}")

    config = {k: v for k, v in row["config"].items() if k != "point"}
    return json.dumps([row["kind"], row["shape"], ident(row["target"]), ident(row["drafter"]),
                       row["prompts"]["sha256"] or row["prompts"]["name"], row["machine"], config], sort_keys=True)


def view(baselines: dict[str, Baseline]) -> list[dict[str, Any]]:
    """The newest row per setup among results not marked superseded, each with the ids it replaces, sorted."""
    newest: dict[str, dict[str, Any]] = {}
    older: dict[str, list[str]] = {}
    for b in baselines.values():
        if b.superseded_by:
            continue
        for row in rows_of(b):
            key = setup(row)
            held = newest.get(key)
            if held is None or (row["created_at"], row["baseline"]) > (held["created_at"], held["baseline"]):
                if held is not None:
                    older.setdefault(key, []).append(held["baseline"])
                newest[key] = row
            else:
                older.setdefault(key, []).append(row["baseline"])
    out = [dict(row, key=key, replaces=sorted(set(older.get(key, [])))) for key, row in newest.items()]
    return sorted(out, key=lambda r: (r["kind"], str((r["target"] or {}).get("path")), r["machine"],
                                      r["prompts"]["name"], r["shape"], r["baseline"]))


def superseded(baselines: dict[str, Baseline], rows: list[dict[str, Any]] | None = None) -> dict[str, str]:
    """Baseline id -> what supersedes it: its own ``superseded_by``, or the newer result on its setup. A result
    that is current on one setup (say, its tree row) is not superseded for being older on another."""
    rows = view(baselines) if rows is None else rows
    out = {bid: str(b.superseded_by) for bid, b in baselines.items() if b.superseded_by}
    current = {r["baseline"] for r in rows}
    for row in rows:
        for old in row["replaces"]:
            if old not in current and old not in out:
                out[old] = row["baseline"]
    return out


def _ident_text(x: dict[str, Any] | None) -> str:
    if x is None:
        return "-"
    return f"{x['path']} ({x['sha256'][:12]})" if x["sha256"] else f"{x['path']} (hash unknown)"


def headline(row: dict[str, Any]) -> str:
    """The row's numbers in one line (plain text)."""
    m = row["metrics"]
    if row["kind"] == "probe":
        parts = [f"accept length {render.fmt(m['online.accept_len'])}"]
        if "breakeven_len" in m:
            parts.append(f"break-even {render.fmt(m['breakeven_len'])}")
        if "measured_speedup_x" in m:
            parts.append(f"{render.fmt(m['measured_speedup_x'])}x plain decoding")
        return ", ".join(parts)
    if row["config"].get("backend") == "sglang":
        names = {"sglang.median_tok_s": "SGLang {} tok/s", "sglang.accept_len": "accept length {}",
                 "sglang_plain.median_tok_s": "SGLang plain {} tok/s", "engine_spec.median_tok_s": "engine {} tok/s",
                 "engine_spec.accept_len": "engine accept length {}", "engine.median_tok_s": "engine plain {} tok/s"}
        return ", ".join(names[k.split(".", 1)[1]].format(render.fmt(v)) for k, v in m.items())
    if row["shape"] == "plain":
        names = {"engine.median_tok_s": "engine", "hf_static_compile.median_tok_s": "transformers static+compile",
                 "hf_generate.median_tok_s": "transformers generate"}
        return ", ".join(f"{names[k]} {render.fmt(v)} tok/s" for k, v in m.items())
    point = row["config"]["point"]
    text = f"{point}: {render.fmt(m[point + '.median_tok_s'])} tok/s"
    if point + ".vs_engine_x" in m:
        text += f" ({render.fmt(m[point + '.vs_engine_x'])}x the engine)"
    if point + ".accept_len" in m:
        text += f", accept length {render.fmt(m[point + '.accept_len'])}"
    return text


def _config_text(row: dict[str, Any]) -> str:
    c = row["config"]
    parts = [str(c.get("dtype"))]
    if c.get("backend") == "sglang":
        parts.insert(0, "SGLang server" + ("" if c.get("cuda_graph") else " without CUDA graphs"))
        parts.append(f"{c.get('num_steps')} steps" + (f", topk {c['eagle_topk']}, {c.get('num_draft_tokens')} tokens"
                                                     if (c.get("eagle_topk") or 1) > 1 else ""))
    if row["kind"] == "probe":
        parts.append(f"{c.get('steps')} steps" + (f", topk {c['topk']}, {c.get('draft_tokens')} tokens"
                                                  if (c.get("topk") or 1) > 1 else ""))
    parts.append(f"{c.get('num_prompts')} x {c.get('max_new_tokens')} tokens")
    return ", ".join(parts)


def table(rows: list[dict[str, Any]], link: Any = None) -> str:
    """The view as a Markdown table (every data string escaped)."""
    out = ["| result | machine | target | drafter | prompts | shape | setup | numbers | baseline |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        name = f"[{r['baseline']}]({link(r['baseline'])})" if link else render.code(r["baseline"])
        what = {"probe": "acceptance", "bench": "throughput"}[r["kind"]]
        out.append(f"| {what} | {render.safe(r['machine'])} | {render.safe(_ident_text(r['target']))} | "
                   f"{render.safe(_ident_text(r['drafter']))} | {render.safe(r['prompts']['name'])} | {r['shape']} | "
                   f"{render.safe(_config_text(r))} | {render.safe(headline(r))} | {name} |")
    return "\n".join(out)
