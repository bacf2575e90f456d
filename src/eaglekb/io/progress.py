"""Progress on long work that has no progress bar of its own: "still working: STAGE" lines.

Owns ``still_working``: a context manager that, while its block runs, writes one line to stderr
(``still working: loading the target (12 s)``) each time ``every`` seconds pass without the block
ending, so that no stage of a command is silent for longer than that. A block that ends sooner
prints nothing. Knows nothing about what the work is.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import IO, Iterator

#: The longest silence a command allows itself before saying it is still working (seconds).
EVERY_S = 5.0


@contextlib.contextmanager
def still_working(stage: str, *, enabled: bool = True, every: float = EVERY_S,
                  stream: IO[str] | None = None) -> Iterator[None]:
    """Say "still working: STAGE (N s)" on STREAM (stderr) every EVERY seconds until the block ends."""
    if not enabled:
        yield
        return
    out = stream or sys.stderr
    done = threading.Event()
    start = time.monotonic()

    def beat() -> None:
        while not done.wait(every):
            try:
                print(f"still working: {stage} ({time.monotonic() - start:.0f} s)", file=out, flush=True)
            except (OSError, ValueError):  # the stream closed under us: stop saying so
                return

    thread = threading.Thread(target=beat, name="eaglekb-still-working", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=1.0)
