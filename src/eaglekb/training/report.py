"""What a training run reports: per-step metrics, the run report, its baseline fields and text.

Owns: ``summarise`` (per-step loss, accuracy, full and conditional accuracy, simulated
accept length from summed counts), ``build_report`` (the ``metrics.json`` document),
``baseline_fields`` (metrics / series / summary of a ``finetune`` baseline, units in
every leaf name; ``source_curve`` names a source's validation curve) and ``render_text``.

Knows nothing about torch modules, data loading, processes, baselines files (the
caller records them) or the task runner.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


#: The history series of one source's validation simulated accept length: this prefix, the source's metric key.
SOURCE_CURVE = "val_by_source_"


def source_curve(key: str) -> str:
    """The series name of a source's validation simulated accept length (``val.by_source.KEY`` of the report)."""
    return f"{SOURCE_CURVE}{key}_simulated_acc_len"


def summarise(stats: torch.Tensor, weight: float = 0.8) -> dict:
    """Per-step metrics from summed counts ``[K, 5]`` (see ``TTTModel.forward``)."""
    s = stats.double().cpu()
    pos = s[:, 1].clamp_min(1)
    ploss = (s[:, 0] / pos).tolist()
    acc = (s[:, 2] / pos).tolist()
    full = (s[:, 3] / pos).tolist()
    cond = (s[:, 3] / s[:, 4].clamp_min(1)).tolist()
    sim, run = 0.0, 1.0
    for a in acc:
        run *= a
        sim += run
    chain = sum(full)
    return {
        "loss": sum(weight ** k * v for k, v in enumerate(ploss)),
        "ploss": ploss, "acc": acc, "full_acc": full, "cond_acc": cond,
        "simulated_acc_len": sim,  # SpecForge: sum_i prod_{j<=i} acc_j, no bonus token
        "chain_acc_len": chain,  # sum_i full_acc_i: the teacher-forced chain, no bonus token
        "positions": int(s[0, 1]),
    }


def build_report(run, history: dict, val: dict | None, step: int, tokens: int, seconds: float, stopped: bool,
                 world: int, profile: dict | None = None) -> dict:
    """The report of a run (``out/metrics.json``): config, progress, throughput, validation, history, data."""
    cfg = run.cfg
    drafter = run.drafter
    n_params = sum(p.numel() for p in drafter.parameters())
    bf16_bytes = sum(t.numel() * (2 if t.is_floating_point() else t.element_size())
                     for t in drafter.state_dict().values())
    return {
        "config": asdict(cfg),
        "step": step,
        "total_steps": run.total_steps,
        "stopped_early": stopped,
        "world_size": world,
        "device": str(run.device),
        "train_sequences": len(run.train_idx),
        "val_sequences": len(run.val_idx),
        "mapping": run.mapping_report,
        "notes": run.notes,
        "drafter": {"config": drafter.config.to_sglang_json(), "parameters": n_params, "bf16_bytes": bf16_bytes},
        "throughput": {"tokens": tokens, "seconds": round(seconds, 3),
                       "tok_s": round(tokens / seconds, 2) if seconds else None},
        "speed": {"amp": cfg.amp if run.device.type == "cuda" else "none (cpu: float32)",
                  "compiled_unroll": run.model.compiled,
                  "compile_scope": run.model.compile_scope,
                  "compiled_loss": run.model.compiled_loss,
                  "compiled_target": bool(run.features is not None and run.features.target.compiled_features),
                  "compile_error": run.model.compile_error,
                  "target_compile_error": run.features.target.compile_error if run.features is not None else None,
                  "loss_chunk": cfg.loss_chunk, "batching": cfg.batching},
        "profile": profile,
        "val": val,
        "history": history,
        "data": {"path": str(run.dataset.path), "identity_hash": run.dataset.manifest["identity_hash"],
                 "prompts": run.dataset.manifest.get("prompts"), "totals": run.dataset.manifest.get("totals")},
    }


def baseline_fields(report: dict) -> dict:
    """metrics / series / summary for a ``finetune`` baseline (units in every leaf name)."""
    val = report.get("val") or {}
    metrics: dict[str, Any] = {
        "throughput": {"train_tok_s": report["throughput"]["tok_s"] or 0.0,
                       "train_s": report["throughput"]["seconds"], "train_tokens": report["throughput"]["tokens"]},
        "run": {"optimizer_steps": report["step"], "train_sequences_count": report["train_sequences"],
                "val_sequences_count": report["val_sequences"],
                "drafter_params": report["drafter"]["parameters"],
                "drafter_bf16_bytes": report["drafter"]["bf16_bytes"]},
    }
    if report.get("wall"):  # the command's wall clock by part (speed.RunClock), beside train_s
        metrics["wall"] = dict(report["wall"])
    if report["mapping"].get("coverage_frac") is not None:
        metrics["run"]["draft_vocab_coverage_frac"] = round(report["mapping"]["coverage_frac"], 5)
    if val:
        metrics["val"] = {
            "loss": {"weighted_loss": round(val["loss"], 5),
                     **{f"step{k}_loss": round(v, 5) for k, v in enumerate(val["ploss"])}},
            "acc": {f"step{k}_pct": round(100 * v, 3) for k, v in enumerate(val["acc"])},
            "full_acc": {f"step{k}_pct": round(100 * v, 3) for k, v in enumerate(val["full_acc"])},
            "cond_acc": {f"step{k}_pct": round(100 * v, 3) for k, v in enumerate(val["cond_acc"])},
            "simulated_acc_len": round(val["simulated_acc_len"], 4),
            "simulated_acc_plus_bonus_len": round(val["simulated_acc_len"] + 1, 4),
            "chain_acc_len": round(val["chain_acc_len"], 4),
            "chain_acc_plus_bonus_len": round(val["chain_acc_len"] + 1, 4),
            "positions_count": val["positions"],
        }
        if val.get("by_source"):
            metrics["val"]["by_source"] = {
                k: {"positions_count": m["positions"], "acc0_pct": round(100 * m["acc0"], 3),
                    "simulated_acc_len": round(m["simulated_acc_len"], 4)} for k, m in val["by_source"].items()}
    prof = report.get("profile")
    if prof:
        metrics["profile"] = {**{f"{k}_ms": v for k, v in prof["ms_per_step"].items()},
                              "step_ms": round(sum(prof["ms_per_step"].values()), 3), "steps_count": prof["steps"],
                              "stalls_count": prof.get("stalls", 0), "stall_ms": prof.get("stall_ms", 0.0)}
    h = report["history"]
    units = {"train_loss": "_loss", "val_loss": "_loss", "train_acc0": "_pct", "val_acc0": "_pct",
             "val_simulated_acc_len": "_len", "train_tok_s": "_tok_s"}
    series = {name: {"x": "step", "unit": "_len" if name.startswith(SOURCE_CURVE) else units[name], "points": pts}
              for name, pts in h.items() if pts}
    summary = (f"{report['step']} steps, {report['throughput']['tok_s']} train tok/s on {report['device']}"
               + (f"; val acc0 {100 * val['acc'][0]:.1f}%, simulated_acc_len {val['simulated_acc_len']:.2f} "
                  f"(+1 bonus = {val['simulated_acc_len'] + 1:.2f})" if val else ""))
    return {"metrics": metrics, "series": series, "summary": summary}


def render_text(report: dict) -> str:
    """The few lines a person reads after a run."""
    lines = [f"trained {report['step']}/{report['total_steps']} steps on {report['device']} "
             f"(world {report['world_size']}): {report['throughput']['tok_s']} tok/s"]
    lines += [f"note: {n}" for n in report["notes"]]
    lines.append(f"mapping: {report['mapping']['source']}")
    prof = report.get("profile")
    if prof:
        total = sum(prof["ms_per_step"].values())
        parts = ", ".join(f"{k} {v:.1f} ms ({100 * prof['share'][k]:.0f}%)" for k, v in prof["ms_per_step"].items()
                          if v > 0)
        stalls = (f"; {prof['stalls']} stalled steps left out ({prof['stall_ms'] / 1000:.1f} s: compiles)"
                  if prof.get("stalls") else "")
        lines.append(f"where a step's time goes ({prof['timer']}, {prof['steps']} steady steps, {total:.1f} ms a step"
                     f"{stalls}): " + parts)
    wall = report.get("wall")
    if wall:
        parts = ", ".join(f"{k[:-2].replace('_', ' ')} {v:.1f} s" for k, v in wall.items() if k != "total_s")
        lines.append(f"wall clock {wall['total_s']:.1f} s: optimiser steps {report['throughput']['seconds']:.1f} s, "
                     + parts)
    val = report.get("val")
    if val:
        lines.append("val acc per step:      " + " ".join(f"{a:.3f}" for a in val["acc"]))
        lines.append("val full acc per step: " + " ".join(f"{a:.3f}" for a in val["full_acc"]))
        lines.append("val cond acc per step: " + " ".join(f"{a:.3f}" for a in val["cond_acc"]))
        lines.append(f"simulated_acc_len {val['simulated_acc_len']:.3f} (SpecForge, no bonus); "
                     f"+1 for runtime accept length = {val['simulated_acc_len'] + 1:.3f}")
        by = sorted((val.get("by_source") or {}).items(), key=lambda kv: (-kv[1]["positions"], kv[0]))
        lines += [f"val source {k}: {m['positions']} positions, acc0 {m['acc0']:.3f}, simulated_acc_len "
                  f"{m['simulated_acc_len']:.3f}" for k, m in by]
    lines.append(f"drafter: {Path(report['config']['out']) / 'drafter'}")
    packed = report.get("pieces")
    if packed:
        lines.append(f"checkpoint in {len(packed['files'])} files ({packed['bytes']} bytes, largest "
                     f"{packed['largest_bytes']}): {packed['manifest']}; resume elsewhere with --resume-from "
                     f"{Path(packed['manifest']).parent}")
    return "\n".join(lines)
