"""`invoke finetune`: train an EAGLE-3 drafter with TTT (from scratch or --init), checkpoints, resume, torchrun."""

from __future__ import annotations

from pathlib import Path

from runbooks._common import claim, cli_errors, emit, finish, given, one_of, refuse_ignored, task, whole


def _is_run_folder(folder: Path) -> bool:
    """A folder a training run wrote (what --out may already hold: a run --resume continues)."""
    return (folder / "checkpoints").is_dir() or (folder / "metrics.json").is_file()


def _agrees_with_init(init, mapping, values: dict) -> None:
    """--draft-vocab-size beside --mapping or --init is the size those bring, or refused: the run takes the
    mapping's and the init drafter's, and must not seem to have used another. --intermediate-size beside --init
    is at least the init drafter's MLP width: a wider one widens that MLP, keeping what it computes."""
    from eaglekb.formats.drafter import read_config
    from eaglekb.formats.mapping import load_mapping
    from eaglekb.io.errors import BadInput

    checks = []
    if given("draft_vocab_size") and (mapping or init):
        source = "--mapping" if mapping else "--init"
        size = load_mapping(mapping).draft_vocab_size if mapping else read_config(init)[0].draft_vocab_size
        checks.append(("--draft-vocab-size", values["draft_vocab_size"], size, source))
    if given("intermediate_size") and init:  # a wider MLP widens the init drafter's (training.drafters.widen_mlp)
        width = read_config(init)[0].intermediate_size
        if int(values["intermediate_size"]) < int(width):
            raise BadInput("option disagrees with --init", where="--intermediate-size",
                           expected=f"{width} or more (the init drafter's MLP width; a wider one widens it) or no "
                                    "--intermediate-size", found=str(values["intermediate_size"]),
                           fix="drop --intermediate-size, or give a width at least the init drafter's")
    for option, value, used, source in checks:
        if int(value) != int(used):
            raise BadInput(f"option disagrees with {source}", where=option,
                           expected=f"{used} (what {source} brings, and what the run uses) or no {option}",
                           found=str(value), fix=f"drop {option}; the size comes from {source}")


def _cuda(device: str) -> bool:
    """Whether the run trains on CUDA (``--device auto`` picks it when there is one)."""
    if str(device) == "auto":
        import torch

        return torch.cuda.is_available()
    return str(device).startswith("cuda")


def _refuse_ignored(data, *, init, mapping, steps, val_data, online_target, values: dict) -> None:
    """Options that would be accepted and have no effect with the others given: refused, one line each
    (the table of docs/reference/options.md, which tests/hostile/test_option_rules.py runs)."""
    from eaglekb.formats.shards import read_manifest

    _agrees_with_init(init, mapping, values)
    cases = [
        ("no_remap", not init, "--init DRAFTER (it keeps that drafter's lm_head rows)"),
        ("epochs", steps is not None, "no --steps (--steps sets the run's length)"),
        ("val_fraction", bool(val_data), "no --val-data (validation is that folder)"),
        ("amp", values.get("amp") not in (None, "none") and not _cuda(values.get("device", "auto")),
         "a CUDA device (autocast is CUDA's; a CPU run trains in float32)"),
        ("piece_mib", not values.get("pieces_out"), "--pieces-out FOLDER (it sizes those pieces)"),
        ("new_data", not (values.get("resume") or values.get("resume_from")),
         "--resume or --resume-from (it continues a run on another dataset)"),
        ("ttt_steps", values.get("method") == "p-eagle",
         "--method eagle3 (a P-EAGLE drafter trains the depths --parallel-tokens sets)"),
        ("parallel_tokens", values.get("method") != "p-eagle", "--method p-eagle"),
    ]
    if online_target and Path(str(data)).is_dir():
        manifest = read_manifest(Path(str(data))) or {}
        features = ((manifest.get("identity") or {}).get("config") or {}).get("features")
        cases.append(("online_target", features == "stored",
                      f"a dataset with online features ({data} stores its features)"))
    refuse_ignored(cases, values)


@task(
    default=True,
    options={"max_len": whole(4, 1 << 20),  # a TTT unroll needs at least 4 positions
             "method": one_of("eagle3", "p-eagle"), "parallel_tokens": whole(2, 64),
             "compile": one_of("auto", "on", "step", "off")},
    help={
        "data": "dataset folder written by invoke datagen",
        "out": "run folder (checkpoints/, drafter/, metrics.json); default .eaglekb/runs/<data name>",
        "init": "start from this drafter checkpoint (remapped when its mapping differs from the data's)",
        "no_remap": "with --init: install the data's d2t WITHOUT moving lm_head rows (reproduces the failure only)",
        "mapping": "use this mapping (mapping file or drafter folder) instead of building one from the data",
        "draft_vocab_size": "draft vocab when the mapping is built from the data",
        "intermediate_size": "drafter MLP width (default: the target's; with --init its own, or wider to widen it)",
        "ttt_steps": "test-time-training unroll length (loss weight 0.8**k per step)",
        "positions": "rotary position per TTT step: runtime (t+k, as SGLang drafts) or specforge (t)",
        "method": "eagle3 (default: the TTT chain drafter) or p-eagle (parallel drafting: --parallel-tokens in one "
                  "drafter pass; --ttt-steps and --positions do not apply)",
        "parallel_tokens": "with --method p-eagle: tokens one drafter pass proposes, the depths trained (default 4)",
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
        "time_budget_s": "start no optimiser step after S seconds of this run's steps (a checkpoint is kept; "
                         "--resume continues): a run that must end before its machine does",
        "min_lr_frac": "the cosine decays to lr x this (default 0)",
        "nproc": "processes through torchrun (one per GPU; gloo on CPU)",
        "device": "auto, cpu or cuda",
        "online_target": "target folder for datasets with online features",
        "threads": "torch CPU threads (default: torch's choice; 1 is fastest on a loaded shared machine)",
        "amp": "CUDA autocast of the TTT forward: bfloat16 (default on CUDA; float32 master weights) or none "
               "(float32); a CPU run trains in float32, --amp bfloat16 there is refused",
        "compile": "torch.compile of the TTT unroll and the loss's chunks: auto (on with CUDA), on, step (as on, the unroll compiled one TTT step at a time: the compile does not grow with --ttt-steps), off; a compile error falls back to eager",
        "loss_chunk": "positions per chunk of the draft-vocab loss, no full logits (default 4096); 0: full logits",
        "profile": "report where a step's time goes per phase (CUDA events on a GPU, wall clock on CPU)",
        "resume_from": "a folder of checkpoint pieces (--pieces-out of an earlier run): checked, joined into --out, "
                       "resumed",
        "pieces_out": "write the last checkpoint into this folder in pieces (for machines that do not outlive the run)",
        "piece_mib": "largest piece of --pieces-out in MiB (default 16; only with --pieces-out)",
        "new_data": "with --resume / --resume-from: continue the run on another dataset (give --mapping and --steps)",
        "json": "print one JSON document as the last line",
        "record": "write baselines/finetune/NAME.json",
        "compare": "compare with baselines/finetune/NAME.json",
    },
)
def finetune(c, data=None, out=None, init=None, no_remap=False, mapping=None, draft_vocab_size=8192,
             intermediate_size=None, ttt_steps=7, positions="runtime", batch_size=8, max_len=1024, steps=None,
             epochs=1.0, lr=1e-4, warmup_frac=0.03, grad_clip=0.5, seed=0, val_data=None, val_fraction=0.05,
             eval_every=0, save_every=0, resume=False, nproc=1, device="auto", online_target=None, json=False,
             record=None, compare=None, threads=None, stop_after=None, min_lr_frac=0.0, batching="random",
             amp=None, compile="auto", loss_chunk=4096, profile=False, resume_from=None, pieces_out=None,
             piece_mib=16.0, new_data=False, time_budget_s=None, method="eagle3", parallel_tokens=4):
    """Train a drafter; report per-step accuracy (full, conditional) and simulated accept length, mixed and per source."""
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
        _refuse_ignored(data, init=init, mapping=mapping, steps=steps, val_data=val_data,
                        online_target=online_target, values=locals())
        out = out or Path(".eaglekb/runs") / Path(str(data)).name
        cfg = training.TrainConfig(
            data=str(data), out=str(out), init=init,
            remap=not no_remap, mapping=mapping, draft_vocab_size=int(draft_vocab_size),
            intermediate_size=int(intermediate_size) if intermediate_size else None, ttt_steps=int(ttt_steps),
            positions=positions, method=str(method), parallel_tokens=int(parallel_tokens), batch_size=int(batch_size), batching=str(batching), max_len=int(max_len),
            steps=int(steps) if steps else None, epochs=float(epochs), lr=float(lr), warmup_frac=float(warmup_frac),
            grad_clip=float(grad_clip), seed=int(seed), val_data=val_data, val_fraction=float(val_fraction),
            eval_every=int(eval_every), save_every=int(save_every), resume=bool(resume), device=device,
            online_target=online_target, stop_after=int(stop_after) if stop_after else None,
            time_budget_s=float(time_budget_s) if time_budget_s else None,
            min_lr_frac=float(min_lr_frac), amp=str(amp or "bfloat16"), compile=str(compile),
            loss_chunk=int(loss_chunk),
            profile=bool(profile), resume_from=resume_from, pieces_out=pieces_out, piece_mib=float(piece_mib),
            new_data=bool(new_data))
        cfg.check()  # the library's rules for the options together, before the run folder is claimed
        claim(out, "--out", folder=True, ours=_is_run_folder, reuse=True, what="training run folder",
              inputs=[data, val_data, init, mapping])
        if int(nproc) > 1:
            report = training.launch(cfg, int(nproc), progress=not json)
        else:
            report = training.train(cfg, progress=not json, log=None if json else print)
        fields = training.baseline_fields(report)
        config = {k: v for k, v in report["config"].items() if k not in ("stop_after", "time_budget_s")}
        config.update(nproc=int(nproc), device=report["device"], threads=threads)
        doc = {"out": cfg.out, "drafter": None if report.get("stopped_early") else str(Path(cfg.out) / "drafter"),
               "step": report["step"], "val": report["val"], "mapping": report["mapping"],
               "notes": report["notes"], "throughput": report["throughput"]}
        doc.update(finish(kind="finetune", record=record, compare=compare, config=config,
                          metrics=fields["metrics"], series=fields["series"], noise=training.NOISE,
                          summary=fields["summary"]))
    text = training.render_text(report)
    if report.get("stopped_early"):  # no drafter folder yet: say where the run stands and how it goes on
        text = text.rsplit("\ndrafter: ", 1)[0] + (
            f"\nstopped after {report['step']} of {report['total_steps']} steps (--stop-after or --time-budget-s): "
            "no drafter yet; "
            f"the checkpoint is in {cfg.out}/checkpoints; continue with the same options and --resume")
    if "recorded" in doc:
        text += f"\nrecorded {doc['baseline_id']} -> {doc['recorded']}"
    if "comparison_text" in doc:
        text += "\n" + doc["comparison_text"]
    emit(doc, text, json)
