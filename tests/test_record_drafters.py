"""Issue 41: every drafter a record names is in the repository, named by content hash.

Each ``provenance.inputs`` entry of role ``drafter`` (``drafter``, ``init``, ``reference_drafter``, an SGLang
server's ``speculative_draft_model_path``) stores a sha256 that a committed folder under ``drafters/`` hashes to
(``provenance.input_identity``: config.json then *.safetensors), whatever path the run read it from; a path it
names under ``drafters/`` is one of those folders. Whether a committed path still holds the files a record hashed
is ``invoke baselines.check``'s (``baselines.drafter_moved``, tests/kb/test_one_truth.py); this file checks that
a clone has the drafter at all.

The records made before the rule that name a drafter no clone can have are listed below, each with the hash it
names and why; a new record is not added here: commit its drafter under ``drafters/`` instead.
"""

from __future__ import annotations

import subprocess
from pathlib import Path, PurePosixPath

from eaglekb.kb import baselines as bl
from eaglekb.measure import provenance as prov

ROOT = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------- the allow-list
# record id -> (the sha256 its drafter input names, or None where it names none; why no clone can have it).

_QWEN05_R2 = ("35af1cca8e51e558253081b6dd88f54770dfabd5c86e6d6c555d97df1afa6abc",
              "the qwen2.5-coder-0.5b r2 drafter (.eaglekb/runs/qwen05-h200/drafter, installed as "
              ".eaglekb/drafters/qwen2.5-coder-0.5b): 66 MB in bf16, never committed (.eaglekb/ is ignored); the "
              "next qwen2.5-coder-0.5b drafter is trained anew and hashes otherwise")
_QWEN05_R2_CODE = ("5a592cbeb8b22330a5bab4bf2d8e3e346aa812d8d9c7495d2965cb8a7d31a2e4",
                   "r2 fine-tuned on code (finetune/h200-qwen05-r2-code's output, .eaglekb/runs/qwen05-code/"
                   "drafter): a run output never committed")
_SMOLLM2_R5 = ("2a8110d6301dda9f6850db203e2531ff6586db23888b8f1a19e9235d69c88f45",
               "the r5 session-1 drafter (.eaglekb/runs/smollm2-r5/drafter): below the default, kept out of the "
               "repository on purpose (docs/journal/2026-12-smollm2-r5-r6.md); its checkpoint was not kept")
_SMOLLM2_R6_S1 = ("ef6303c361cb8cdf30bc26d1adef90d6e8769b61ea1bdc5a1bb06297bd23064a",
                  "r6 after session 1 (.eaglekb/runs/smollm2-r6/checkpoints/step-0003898): an intermediate "
                  "checkpoint; only the finished r6 is committed (drafters/smollm2-135m-r6)")
_SMOLLM2_R6_S2T3 = ("b2f5a6a57c631f8a51dc383f519da6767b60851c0b38884f78124bd15d8da8ed",
                    "r6 after session 2 (.eaglekb/runs/smollm2-r6/checkpoints/step-0007009): an intermediate "
                    "checkpoint; only the finished r6 is committed (drafters/smollm2-135m-r6)")
_SMOLLM2_R3 = (None,
               "the r3 default, read from drafters/smollm2-135m-default before r4 replaced it: sha256 null with a "
               "git pointer (0684444bc9:drafters/smollm2-135m-default, which hashes to 72c3a0a2a8f2...); no "
               "committed folder holds it now")
_RUN_OUTPUT = (None,
               "a run output on the recording machine (.eaglekb/runs/..., /tmp/..., .eaglekb/story/...) whose "
               "files were not kept: sha256 null, `unknown` says so")


def _allow(entry: tuple[str | None, str], *ids: str) -> dict[str, tuple[str | None, str]]:
    return {bid: entry for bid in ids}


ALLOWED: dict[str, tuple[str | None, str]] = {
    **_allow(_QWEN05_R2, "bench/h200-qwen05-r2", "bench/h200-qwen05-r2-builtin", "bench/h200-qwen05-r2-gsm8k-eval",
             "finetune/h200-qwen05-r2-code", "probe/cpu-qwen05-r2-humaneval", "probe/h200-qwen05-r2-builtin",
             "probe/h200-qwen05-r2-gsm8k-eval", "probe/h200-qwen05-r2-humaneval"),
    **_allow(_QWEN05_R2_CODE, "probe/h200-qwen05-r2-code-builtin", "probe/h200-qwen05-r2-code-humaneval"),
    **_allow(_SMOLLM2_R5, "probe/h200-smollm2-r5-s1-builtin", "probe/h200-smollm2-r5-s1-gsm8k-eval"),
    **_allow(_SMOLLM2_R6_S1, "bench/cpu-smollm2-r6-s1-builtin", "probe/h200-smollm2-r6-s1-builtin",
             "probe/h200-smollm2-r6-s1-gsm8k-eval"),
    **_allow(_SMOLLM2_R6_S2T3, "probe/h200-smollm2-r6-s2t3-builtin", "probe/h200-smollm2-r6-s2t3-gsm8k-eval"),
    **_allow(_SMOLLM2_R3, "bench/cpu-smollm2-default-r3", "finetune/h200-scaling-1gpu", "finetune/h200-scaling-2gpu",
             "finetune/h200-scaling-2gpu-rerun", "finetune/smollm2-default-h200x2-r4",
             "probe/cpu-smollm2-default-r3-builtin-4x128", "probe/cpu-smollm2-default-r3-gsm8k-eval",
             "probe/cpu-smollm2-default-r3-humaneval"),
    **_allow(_RUN_OUTPUT, "bench/h200-smollm2-default-r2", "bench/h200-smollm2-default-r3",
             "bench/h200-story-b-remap-bf16", "finetune/story-h200-b-noremap", "finetune/story-h200-b-noremap-small",
             "finetune/story-h200-b-remap", "finetune/story-h200-b-remap-small",
             "probe/cpu-smollm2-default-r2-builtin", "probe/cpu-smollm2-default-r2-gsm8k-eval",
             "probe/cpu-smollm2-default-r2-humaneval", "probe/cpu-smollm2-default-r3-builtin",
             "probe/h200-scaling-1gpu-gsm8k-eval", "probe/h200-scaling-2gpu-gsm8k-eval",
             "probe/h200-smollm2-default-r2-gsm8k-eval", "probe/h200-smollm2-default-r3-gsm8k-eval",
             "probe/story-cpu-a-scratch", "probe/story-cpu-b-noremap", "probe/story-cpu-b-remap",
             "probe/story-cpu-b-remap-2steps", "probe/story-h200-a-scratch", "probe/story-h200-b-noremap",
             "probe/story-h200-b-remap", "probe/story-h200-b-scratch", "probe/story-h200-rerun-a-scratch"),
}


# --------------------------------------------------------------------------- the committed drafters


def _committed_drafters() -> dict[str, str | None]:
    """Each folder under drafters/ that git holds (what a clone has) -> its content sha256, hashed once."""
    listed = subprocess.run(["git", "ls-files", "-z", "--", "drafters"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    folders = sorted({str(PurePosixPath(p).parent) for p in listed if p.count("/") == 2})
    return {f: prov.input_identity("drafter", f, ROOT).get("sha256") for f in folders}


def _repo_path(path: str) -> str | None:
    """PATH as a folder under drafters/ (``drafters/NAME``), or None for a path elsewhere."""
    parts = PurePosixPath(path).parts
    if parts and parts[0] == ".":
        parts = parts[1:]
    return "/".join(parts) if parts and parts[0] == "drafters" else None


def _own_untrained(record, entry) -> bool:
    """The seeded random drafter a plan.sglang record's own command writes (config.untrained_drafter): rerunning the
    recorded command makes it again, so it is an output of the record, not a drafter a clone must hold."""
    made = (record.config or {}).get("untrained_drafter") or {}
    return record.kind == "plan" and bool(made.get("path")) and made["path"] == entry.path


def test_every_drafter_a_record_names_is_committed_by_its_hash():
    committed = _committed_drafters()
    missing = sorted(f for f, sha in committed.items() if not sha)
    assert committed and not missing, (f"committed drafter folders without config.json + *.safetensors in this "
                                       f"checkout: {missing}; restore them with `git checkout -- drafters`")
    held = set(committed.values())
    records = bl.load_all(ROOT)
    bad: list[str] = []
    used: set[str] = set()
    for bid, record in sorted(records.items()):
        for key, entry in sorted((record.provenance.inputs or {}).items()):
            if entry.role != "drafter" or _own_untrained(record, entry) or entry.unknown == prov.BUILT_BY_COMMAND:
                continue
            repo = _repo_path(entry.path)
            why = []
            if repo is not None and repo not in committed:
                why.append(f"names {entry.path}, which no committed folder is")
            if entry.sha256 is None:
                why.append(f"names no sha256 ({entry.unknown})")
            elif entry.sha256 not in held:
                why.append(f"sha256 {entry.sha256[:12]}... is no committed drafter's")
            if not why:
                continue
            if bid in ALLOWED and ALLOWED[bid][0] == entry.sha256:  # the listed drafter, and no other
                used.add(bid)
                continue
            bad.append(f"{bid}: provenance.inputs.{key} ({entry.path}): {'; '.join(why)}")
    assert not bad, ("records name drafters a clone lacks; commit each under drafters/NAME (config.json + "
                     "model.safetensors) so its hash is a committed folder's:\n" + "\n".join(bad))
    stale = sorted(set(ALLOWED) - used)
    assert not stale, f"allow-listed records that are gone or now pass (remove them from ALLOWED): {stale}"
