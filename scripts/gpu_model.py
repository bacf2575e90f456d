"""Bring an embedded model to the GPU machine in pieces, then assemble, verify and convert it there.

The device machine has no registry access and each call carries at most 64 MiB, so the GGUF
travels split (`split -b 45M -d FILE .carry/NAME.gguf.part`), one or two chunks per call:

    python3 scripts/gpu_model.py stash .carry/smollm2.gguf.part00          # call 1
    python3 scripts/gpu_model.py assemble smollm2-135m .carry/*.part0[12]  # call 2: join, verify, convert

The assembled file is checked against the source's pinned SHA-256 before use; the bf16 safetensors
folder lands in $EAGLEKB_CACHE (default /tmp/eaglekb-cache) for the rest of the session.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

STASH = Path(os.environ.get("EAGLEKB_STASH", "/tmp/eaglekb-stash"))


def stash(chunks: list[str]) -> None:
    STASH.mkdir(parents=True, exist_ok=True)
    for c in chunks:
        shutil.copy(c, STASH / Path(c).name)
        print(f"stashed {c} ({Path(c).stat().st_size} bytes)", flush=True)


def assemble(name: str, chunks: list[str]) -> Path:
    from eaglekb.models import sources

    stash(chunks)
    src = sources._source(name)
    parts = sorted(STASH.glob("*.part*"))
    gguf_dir = STASH / "gguf"
    gguf_dir.mkdir(exist_ok=True)
    gguf = gguf_dir / "model.gguf"
    digest = sources.assemble(parts, gguf)
    sources.check_sha256(digest, src.sha256, str(gguf))
    out = Path(os.environ.get("EAGLEKB_CACHE", "/tmp/eaglekb-cache")) / "models" / name
    if not (out / "config.json").is_file():
        t0 = time.perf_counter()
        out.mkdir(parents=True, exist_ok=True)
        info = sources.convert_gguf(gguf_dir, gguf.name, out)
        print(f"converted {name} in {time.perf_counter() - t0:.1f} s: {info}", flush=True)
    print(f"model ready at {out} (sha256 {digest} verified)", flush=True)
    return out


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    if cmd == "stash":
        stash(rest)
    elif cmd == "assemble":
        assemble(rest[0], rest[1:])
    else:
        raise SystemExit(f"unknown command {cmd!r}; expected stash or assemble")
