"""Record a run made on the device machine (which has no invoke or pydantic) as a baseline here.

The GPU scripts (scripts/gpu_bench.py, scripts/gpu_train_default.py) write JSON with the run's own
environment (host, GPU, versions, time). This turns one such file into baselines/KIND/NAME.json with
the provenance of the machine that ran it, not of this one:

    python scripts/record_device_run.py bench h200-smollm2-default-bf16 OUT/bench.json \\
        --command "python3 scripts/gpu_bench.py ..." --commit SHA --driver 580.159.04

A story run (`invoke story.run`) is recorded with `invoke story.record`; --part picks a sub-document
of other JSON files (probe, datagen.a).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from eaglekb.kb import baselines  # noqa: E402
from eaglekb.kb.baselines import flatten  # noqa: E402
from eaglekb.measure.provenance import from_device_env  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=["bench", "probe", "finetune", "datagen"])
    ap.add_argument("name")
    ap.add_argument("file")
    ap.add_argument("--command", required=True, help="the exact command run on the device machine")
    ap.add_argument("--commit", required=True, help="the git commit the device machine ran")
    ap.add_argument("--driver", default=None)
    ap.add_argument("--cpus", type=int, default=None)
    ap.add_argument("--env-json", default=None, help="a JSON file with the run's env, when the result has none")
    ap.add_argument("--part", default=None, help="dotted key of the sub-document to record (probe, datagen.a)")
    ap.add_argument("--dry-run", action="store_true", help="validate against the schema, write nothing")
    args = ap.parse_args(argv)
    top = json.loads(Path(args.file).read_text())
    doc = top
    for key in (args.part.split(".") if args.part else []):
        if not isinstance(doc, dict) or key not in doc:
            raise SystemExit(f"error: {args.file} has no part {args.part!r}")
        doc = doc[key]
    env = doc.get("env") or top.get("env") or json.loads(Path(args.env_json).read_text())
    metrics = doc["metrics"]
    paths = set(flatten(metrics))
    if args.kind == "bench":
        noise = {"repeats": doc["config"]["repeats"], "spread_kind": "range",
                 "spread": {k: v for k, v in doc.get("spread", {}).items() if k in paths}, "tolerance_rel": 0.25}
    elif args.kind == "probe":
        from eaglekb.measure.probe import noise as probe_noise

        noise = probe_noise(metrics)
    elif args.kind == "finetune":  # as runbooks/finetune.py records
        from eaglekb.training.loop import NOISE as noise
    else:  # datagen, as runbooks/datagen.py records
        from eaglekb.data.datagen import NOISE as noise
    config = dict(doc["config"], prompts_manifest=doc.get("prompts_manifest"), device_run_wall_s=doc.get("wall_s"))
    b = baselines.build(kind=args.kind, name=args.name, config=config, metrics=metrics, noise=noise,
                        summary=doc.get("summary"), series=doc.get("series") or None, created_at=env.get("time"),
                        provenance=from_device_env(env, args.command, args.commit, args.driver, args.cpus), root=ROOT)
    if args.dry_run:
        print(f"valid {args.kind}/{args.name} ({len(paths)} metrics); not written (--dry-run)")
        return
    print(baselines.write(b, ROOT))


if __name__ == "__main__":
    main()
