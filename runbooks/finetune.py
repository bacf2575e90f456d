"""`invoke finetune`: train an EAGLE-3 drafter with TTT (from scratch or --init), checkpoints, resume, torchrun."""

from __future__ import annotations

from runbooks._common import cli_errors, emit, finish, task

@task(
    default=True,
    help={
        "data": "dataset folder written by invoke datagen",
        "out": "run folder (checkpoints/, drafter/, metrics.json); default .eaglekb/runs/<data name>",
        "init": "start from this drafter checkpoint (remapped when its mapping differs from the data's)",
        "no_remap": "with --init: install the data's d2t WITHOUT moving lm_head rows (reproduces the failure only)",
        "mapping": "use this mapping (mapping file or drafter folder) instead of building one from the data",
        "draft_vocab_size": "draft vocab when the mapping is built from the data",
        "intermediate_size": "drafter MLP width (default: the target's)",
        "ttt_steps": "test-time-training unroll length (loss weight 0.8**k per step)",
        "positions": "rotary position per TTT step: runtime (t+k, as SGLang drafts) or specforge (t)",
        "batch_size": "sequences per optimiser step (over all processes)",
        "batching": "random (shuffled) or length (shuffled, then sequences of similar length batched together)",
        "max_len": "tokens kept per sequence",
        "steps": "optimiser steps (default: --epochs over the training sequences)",
        "epochs": "passes over the training sequences when --steps is absent",
        "lr": "peak learning rate (linear warmup, cosine decay)",
        "warmup_frac": "share of steps with warmup",
        "grad_clip": "max gradient norm (0: off)",
        "seed": "weights, data order and validation split",
        "val_data": "held-out dataset folder (default: hold out --val-fraction of --data)",
        "val_fraction": "share of sequences held out for validation",
        "eval_every": "validate every N steps (0: at the end)",
        "save_every": "checkpoint every N steps (0: at the end)",
        "resume": "continue from the newest checkpoint in --out",
        "stop_after": "stop after N optimiser steps of this run (a checkpoint is kept; --resume continues)",
        "min_lr_frac": "the cosine decays to lr x this (default 0)",
        "nproc": "processes through torchrun (one per GPU; gloo on CPU)",
        "device": "auto, cpu or cuda",
        "online_target": "target folder for datasets with online features",
        "threads": "torch CPU threads (default: torch's choice; 1 is fastest on a loaded shared machine)",
        "json": "print one JSON document as the last line",
        "record": "write baselines/finetune/NAME.json",
        "compare": "compare with baselines/finetune/NAME.json",
    },
)
def finetune(c, data=None, out=None, init=None, no_remap=False, mapping=None, draft_vocab_size=8192,
             intermediate_size=None, ttt_steps=7, positions="runtime", batch_size=8, max_len=1024, steps=None,
             epochs=1.0, lr=1e-4, warmup_frac=0.03, grad_clip=0.5, seed=0, val_data=None, val_fraction=0.05,
             eval_every=0, save_every=0, resume=False, nproc=1, device="auto", online_target=None, json=False,
             record=None, compare=None, threads=None, stop_after=None, min_lr_frac=0.0, batching="random"):
    """Train a drafter; report per-step accuracy (full, conditional) and simulated accept length."""
    with cli_errors():
        from pathlib import Path

        if threads:
            import torch

            torch.set_num_threads(int(threads))

        from eaglekb import training
        from eaglekb.io.errors import BadInput

        if not data:
            raise BadInput("missing option", where="--data", expected="a dataset folder from invoke datagen",
                           found="nothing")
        cfg = training.TrainConfig(
            data=str(data), out=str(out or Path(".eaglekb/runs") / Path(str(data)).name), init=init,
            remap=not no_remap, mapping=mapping, draft_vocab_size=int(draft_vocab_size),
            intermediate_size=int(intermediate_size) if intermediate_size else None, ttt_steps=int(ttt_steps),
            positions=positions, batch_size=int(batch_size), batching=str(batching), max_len=int(max_len),
            steps=int(steps) if steps else None, epochs=float(epochs), lr=float(lr), warmup_frac=float(warmup_frac),
            grad_clip=float(grad_clip), seed=int(seed), val_data=val_data, val_fraction=float(val_fraction),
            eval_every=int(eval_every), save_every=int(save_every), resume=bool(resume), device=device,
            online_target=online_target, stop_after=int(stop_after) if stop_after else None,
            min_lr_frac=float(min_lr_frac))
        if int(nproc) > 1:
            report = training.launch(cfg, int(nproc), progress=not json)
        else:
            report = training.train(cfg, progress=not json, log=None if json else print)
        fields = training.baseline_fields(report)
        config = {k: v for k, v in report["config"].items() if k not in ("stop_after",)}
        config.update(nproc=int(nproc), device=report["device"], threads=threads)
        doc = {"out": cfg.out, "step": report["step"], "val": report["val"], "mapping": report["mapping"],
               "notes": report["notes"], "throughput": report["throughput"]}
        doc.update(finish(kind="finetune", record=record, compare=compare, config=config,
                          metrics=fields["metrics"], series=fields["series"], noise=training.NOISE,
                          summary=fields["summary"]))
    text = training.render_text(report)
    if "recorded" in doc:
        text += f"\nrecorded {doc['baseline_id']} -> {doc['recorded']}"
    if "comparison_text" in doc:
        text += "\n" + doc["comparison_text"]
    emit(doc, text, json)
