"""Kubernetes timestamps: RFC 3339 in UTC to the second, as ``metav1.Time`` is written, and read
back (``metav1.MicroTime``'s fraction too). One place for what was written out in a dozen
modules. Pure."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["TIME_FORMAT", "parse_time", "rfc3339", "unix_seconds"]

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
"""``metav1.Time`` as the API server writes it: second precision, ``Z``."""


def rfc3339(when: datetime | float | None = None) -> str:
    """``when`` as the API server writes a time: a datetime (one without a time zone is taken
    as UTC), Unix seconds, or now when ``None``."""
    if when is None:
        when = datetime.now(UTC)
    elif isinstance(when, int | float):
        when = datetime.fromtimestamp(when, UTC)
    elif when.tzinfo is not None:
        when = when.astimezone(UTC)
    return when.strftime(TIME_FORMAT)


def parse_time(text: str) -> datetime:
    """A time the API server wrote (``Z`` or an offset, with or without a fraction), as an
    aware datetime; one without a time zone is taken as UTC. ``ValueError`` when it is none."""
    parsed = datetime.fromisoformat(text)  # reads "Z" since Python 3.11, at a tenth of strptime's cost
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def unix_seconds(text: str) -> float:
    """Unix seconds of a time the API server wrote."""
    return parse_time(text).timestamp()
