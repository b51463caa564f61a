"""kube.times: the API server's timestamps, written and read back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from kube.times import parse_time, rfc3339, unix_seconds

T = datetime(2026, 11, 28, 10, 0, 3, 456789, tzinfo=UTC)


def test_a_time_is_written_as_the_api_server_writes_it() -> None:
    assert rfc3339(T) == "2026-11-28T10:00:03Z"  # second precision, Z
    assert rfc3339(T.timestamp()) == "2026-11-28T10:00:03Z"  # Unix seconds
    assert rfc3339(1_700_000_000) == "2023-11-14T22:13:20Z"
    assert rfc3339(T.replace(tzinfo=None)) == "2026-11-28T10:00:03Z"  # naive: taken as UTC
    # another zone is converted, not relabelled
    assert rfc3339(T.astimezone(timezone(timedelta(hours=2)))) == "2026-11-28T10:00:03Z"
    before = datetime.now(UTC).replace(microsecond=0)
    assert before <= parse_time(rfc3339()) <= datetime.now(UTC)


def test_a_time_is_read_back_aware_and_in_unix_seconds() -> None:
    assert parse_time("2026-11-28T10:00:03Z") == T.replace(microsecond=0)
    assert parse_time("2026-11-28T10:00:03.456789Z") == T  # MicroTime (Leases)
    assert parse_time("2026-11-28T12:00:03+02:00") == T.replace(microsecond=0)
    assert parse_time("2026-11-28T10:00:03").tzinfo is UTC
    assert unix_seconds("2024-06-01T10:00:03Z") == 1717236003.0
    assert unix_seconds(rfc3339(1_700_000_000)) == 1_700_000_000


def test_what_is_no_time_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        parse_time("yesterday")
    with pytest.raises(ValueError):
        unix_seconds("None")
