"""story.json: the run's one document, rewritten atomically after every stage, and read back with checks.

Owns the document's top-level layout (kind, config, env, provenance, stages, datagen, mappings, runs, arms,
verdicts, skipped, complete, total_s), the short ``env`` summary drawn from the provenance capture, and
``load``. Knows nothing about how the stages fill it.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from eaglekb.io.errors import BadInput, MissingFile
from eaglekb.io.files import atomic_write_json
from eaglekb.studies.story.config import STORY_FILE, StoryConfig


def story_env(prov: dict[str, Any]) -> dict[str, Any]:
    """The short environment each stage's record carries, from a ``provenance.capture()``, stamped now."""
    host, versions = prov.get("host") or {}, prov.get("versions") or {}
    gpus = host.get("gpus") or []
    return {"python": versions.get("python"), "torch": versions.get("torch"),
            "transformers": versions.get("transformers"), "cuda": host.get("cuda"),
            "gpu": gpus[0].get("name") if gpus else None, "host": host.get("hostname"),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


class StoryDoc:
    """story.json, rewritten atomically after each stage (a killed run keeps what it finished)."""

    def __init__(self, out: Path, cfg: StoryConfig, environment: dict, prov: dict, t0: float):
        self.path = out / STORY_FILE
        self.t0 = t0
        self.bar = None  # a stage progress bar, when the caller wants one
        self.doc: dict[str, Any] = {
            "kind": "story", "config": dataclasses.asdict(cfg), "env": environment, "provenance": prov,
            "stages": {}, "datagen": {}, "mappings": {}, "runs": {}, "arms": {}, "verdicts": {}, "skipped": [],
            "complete": False}

    def stage(self, name: str, seconds: float) -> None:
        """Record a finished stage's seconds, save, and advance the progress bar."""
        self.doc["stages"][f"{name}_s"] = round(seconds, 2)
        self.save()
        if self.bar is not None:
            self.bar.update(1)

    def save(self) -> None:
        self.doc["total_s"] = round(time.perf_counter() - self.t0, 2)
        atomic_write_json(self.path, self.doc, default=str)


def load(run_dir: str | Path) -> dict[str, Any]:
    """The story document of a run's output folder; one-line errors when it is missing or not a story."""
    path = Path(run_dir) / STORY_FILE
    if not path.is_file():
        raise MissingFile("no story output", where=str(path), expected=f"{STORY_FILE} from `invoke story.run`",
                          found="nothing")
    try:
        doc = json.loads(path.read_text())
    except ValueError as exc:
        raise BadInput("not JSON", where=str(path), expected="a story document", found=str(exc)) from None
    if not isinstance(doc, dict) or doc.get("kind") != "story":
        raise BadInput("not a story document", where=str(path), expected='"kind": "story"',
                       found=repr(doc.get("kind") if isinstance(doc, dict) else type(doc).__name__))
    return doc
