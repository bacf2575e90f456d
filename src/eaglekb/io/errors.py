"""One errors module for eaglekb.

Owns: the exception types every library function raises on bad input, and the
one-line message format (what, where, expected, found, fix); ``compiler_failure``, the one line a run keeps when
``torch.compile`` fails and it falls back to eager. Knows nothing about
the task runner: runbooks turn an ``EaglekbError`` into a one-line message and a
non-zero exit; the library only raises.

Each exception subclasses a built-in so callers that catch ``ValueError`` or
``FileNotFoundError`` keep working.
"""

from __future__ import annotations

#: Characters that would break a one-line message, and how they are written instead.
_BREAKS = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x0b": "\\v", "\x0c": "\\f", "\x1c": "\\x1c",
           "\x1d": "\\x1d", "\x1e": "\\x1e", "\x85": "\\x85", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def one_line(text: str) -> str:
    """``text`` with line breaks and other control characters escaped (``\\n``, ``\\x00``): always one line."""
    return "".join(_BREAKS.get(ch) or (f"\\x{ord(ch):02x}" if ord(ch) < 32 or ord(ch) == 127 else ch)
                   for ch in str(text))


def compiler_failure(exc: BaseException) -> str:
    """One line for a ``torch.compile`` error (what a run says when it falls back to eager): its type and its
    innermost cause's first non-empty line."""
    inner = exc
    while getattr(inner, "inner_exception", None) is not None or inner.__cause__ is not None:
        inner = getattr(inner, "inner_exception", None) or inner.__cause__
    lines = [ln.strip() for ln in str(inner).splitlines() if ln.strip()]
    text = f"{type(inner).__name__}: {lines[0][:160]}" if lines else type(inner).__name__
    return text if inner is exc else f"{type(exc).__name__} ({text})"


def first_line(exc: BaseException | str, limit: int = 200) -> str:
    """The first non-blank line of an exception's message (or text), at most ``limit`` characters; the
    exception's type name when the message is empty."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[0][:limit] if lines else (type(exc).__name__ if isinstance(exc, BaseException) else "")


class EaglekbError(Exception):
    """Base class: a message that fits on one line and names what, where, expected, found."""

    exit_code = 2

    def __init__(
        self,
        what: str,
        *,
        where: str | None = None,
        expected: str | None = None,
        found: str | None = None,
        fix: str | None = None,
    ) -> None:
        self.what = what
        self.where = where
        self.expected = expected
        self.found = found
        self.fix = fix
        super().__init__(self.line())

    def line(self) -> str:
        parts = [self.what]
        if self.where:
            parts.append(f"in {self.where}")
        if self.expected is not None:
            parts.append(f"expected {self.expected}")
        if self.found is not None:
            parts.append(f"found {self.found}")
        if self.fix:
            parts.append(f"fix: {self.fix}")
        # One line, always: a newline in a value (a file name, a found value) is escaped, not printed.
        return one_line(": ".join(parts[:1]) + ("; " + "; ".join(parts[1:]) if len(parts) > 1 else ""))

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.line()


class BadInput(EaglekbError, ValueError):
    """A value given by the user is out of range, malformed, or inconsistent."""


class SchemaError(EaglekbError, ValueError):
    """A file (baseline JSON, config.json, mapping) does not match its schema."""


class MissingFile(EaglekbError, FileNotFoundError):
    """A file or folder the command needs does not exist."""


class IntegrityError(EaglekbError, ValueError):
    """Content is corrupt or does not match a pinned hash."""


class Incompatible(EaglekbError, ValueError):
    """Two artefacts (drafter and target, two mappings) cannot be used together."""


class Unavailable(EaglekbError, RuntimeError):
    """A resource (model hub, server, package, GPU) cannot be reached here."""


class DocsError(EaglekbError, ValueError):
    """A docs page cites a baseline or finding that does not exist, or uses an unknown placeholder."""
