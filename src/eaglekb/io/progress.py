"""Progress lines for slow work that has no progress bar of its own: a first line, then "still working".

Owns ``announce``: the first line of a command whose start is slow (imports, loading a model), shown at
once on a terminal (``loading smollm2-135m ...``); in a pipe or a log it is left out, so that a command
that fails says so in its one error line alone.

Owns ``still_working``: a context manager that, while its block runs, writes one line to stderr
(``still working: loading the target (12 s)``) each time ``every`` seconds pass without the block
ending, so that no stage of a command is silent for longer than that. A block that ends sooner
prints nothing. A line is written through tqdm's writer: a progress bar live on the same stream (ours,
or a library's such as the model loader's) is cleared, the line printed, and the bar drawn again under
it, so a line never lands in the middle of a bar. Knows nothing about what the work is.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import IO, Iterator

#: The longest silence a command allows itself before saying it is still working (seconds).
EVERY_S = 5.0


def say(line: str, stream: IO[str] | None = None) -> None:
    """Write one LINE on STREAM (stderr) above any live progress bar there, never into it."""
    from tqdm import tqdm

    out = stream or sys.stderr
    tqdm.write(line, file=out)
    out.flush()


def announce(line: str, *, enabled: bool = True, stream: IO[str] | None = None) -> bool:
    """Say LINE now on STREAM (stderr) when it is a terminal; returns whether it was said."""
    out = stream or sys.stderr
    try:
        if not enabled or not out.isatty():
            return False
        say(line, out)
    except (OSError, ValueError):  # closed or detached: nothing to tell
        return False
    return True


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
                say(f"still working: {stage} ({time.monotonic() - start:.0f} s)", out)
            except (OSError, ValueError):  # the stream closed under us: stop saying so
                return

    thread = threading.Thread(target=beat, name="eaglekb-still-working", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=1.0)
