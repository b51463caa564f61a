"""Following a twin's log across a cut of the connection to the provider. Pure.

``kubectl logs -f`` of an offloaded pod is the twin's ``pods/log?follow=true`` on the provider,
streamed back. When that stream is cut (the provider's API server restarted, a connection reset)
while the container still runs, the virtual kubelet opens it again and goes on where it was, so
that the user's follow neither ends, as if the container had, nor repeats lines.

To know where it was, it asks the provider for timestamps (``timestamps=true``) and takes them
off again unless the user asked for them too: each line starts with its RFC 3339 time and a
space. A reopened stream starts at the second of the last line passed on (``sinceTime`` has
whole seconds) and :class:`LogCursor` drops what was passed on already: lines before that line's
time, and as many lines of that very time as were passed on. Only whole lines are passed on;
a line cut in the middle comes again whole.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping

__all__ = ["LogCursor", "line_time", "resumable", "resume_params"]


STAMP = re.compile(rb"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d) ")


def line_time(line: bytes) -> int | None:
    """Nanoseconds since the epoch of a log line's leading timestamp (``2026-12-07T06:30:00.
    123456789Z ...``: up to nine fraction digits, ``Z`` or an offset); None when it has none."""
    found = STAMP.match(line)
    if found is None:
        return None
    whole, fraction, zone = (part.decode() if part else "" for part in found.groups())
    try:
        when = datetime.datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone))
    except ValueError:
        return None
    return int(when.timestamp()) * 1_000_000_000 + int(fraction.ljust(9, "0") or 0)


def resumable(params: Mapping[str, str]) -> bool:
    """Whether a log request with these query ``params`` is followed again after a cut: a
    follow, not of the previous container, not bounded in bytes (counted with the timestamps
    the reopened stream would carry)."""
    return (
        params.get("follow") in ("true", "1")
        and params.get("previous") not in ("true", "1")
        and "limitBytes" not in params
    )


def resume_params(params: Mapping[str, str], last: int) -> dict[str, str]:
    """The query that reopens a followed log after the line at ``last`` (nanoseconds): from
    that line's second, with timestamps, and without the first request's starting point."""
    reopened = {k: v for k, v in params.items() if k not in ("tailLines", "sinceSeconds", "sinceTime")}
    second = datetime.datetime.fromtimestamp(last // 1_000_000_000, datetime.UTC)
    reopened["sinceTime"] = second.strftime("%Y-%m-%dT%H:%M:%SZ")
    reopened["timestamps"] = "true"
    return reopened


class LogCursor:
    """What of a timestamped log stream to pass on: whole lines, each once, without their
    timestamps unless ``keep_timestamps``."""

    def __init__(self, *, keep_timestamps: bool) -> None:
        self.keep_timestamps = keep_timestamps
        self.last: int | None = None
        """The time of the last line passed on (nanoseconds)."""
        self._at_last = 0
        """How many lines of time ``last`` were passed on."""
        self._skip_at_last = 0
        """How many lines of time ``last`` the reopened stream repeats, still to drop."""
        self._partial = b""

    def reopened(self) -> None:
        """The stream is opened again (:func:`resume_params`): what it repeats is dropped, and a
        line cut in the middle comes again whole."""
        self._partial = b""
        self._skip_at_last = self._at_last

    def feed(self, chunk: bytes) -> bytes:
        """What of ``chunk`` to pass on now (whole lines only)."""
        data = self._partial + chunk
        end = data.rfind(b"\n")
        if end < 0:
            self._partial = data
            return b""
        self._partial = data[end + 1 :]
        return b"".join(self._line(line) for line in data[: end + 1].splitlines(keepends=True))

    def end(self) -> bytes:
        """The stream ended: its last line, if it had no newline."""
        rest, self._partial = self._partial, b""
        return self._line(rest) if rest else b""

    def _line(self, line: bytes) -> bytes:
        when = line_time(line)
        if when is not None and self.last is not None:
            if when < self.last:
                return b""  # passed on before the cut
            if when == self.last and self._skip_at_last > 0:
                self._skip_at_last -= 1
                return b""
        if when is not None:
            if when != self.last:
                self.last, self._at_last, self._skip_at_last = when, 0, 0
            self._at_last += 1
        if self.keep_timestamps or when is None:
            return line
        return line.partition(b" ")[2]
