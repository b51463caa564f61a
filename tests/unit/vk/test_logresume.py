"""Where a followed log goes on after a cut: the lines' times, which requests are followed again."""

from __future__ import annotations

from vk.kubelet.logresume import LogCursor, line_time, resumable, resume_params

SECOND = 1_796_625_000 * 1_000_000_000  # 2026-12-07T06:30:00Z


def test_a_lines_time_is_read_to_the_nanosecond_in_any_zone() -> None:
    assert line_time(b"2026-12-07T06:30:00.123456789Z hi\n") == SECOND + 123_456_789
    assert line_time(b"2026-12-07T06:30:00.5Z hi") == SECOND + 500_000_000  # fewer digits
    assert line_time(b"2026-12-07T06:30:00Z hi") == SECOND
    assert line_time(b"2026-12-07T07:30:00.5+01:00 hi") == SECOND + 500_000_000
    assert line_time(b"epoch 1: loss 0.93\n") is None
    assert line_time(b"2026-12-07T06:30:00.5Zhi") is None  # no space after it: not a timestamp
    assert line_time(b"2026-13-07T06:30:00Z hi") is None  # no such month


def test_only_a_follow_of_the_running_container_unbounded_in_bytes_is_followed_again() -> None:
    assert resumable({"follow": "true"})
    assert not resumable({})
    assert not resumable({"follow": "true", "previous": "true"})
    assert not resumable({"follow": "true", "limitBytes": "10"})


def test_a_reopened_follow_starts_at_the_second_of_the_last_line_with_timestamps() -> None:
    asked = {"container": "main", "follow": "true", "tailLines": "5", "sinceSeconds": "60"}
    assert resume_params(asked, SECOND + 999_999_999) == {
        "container": "main", "follow": "true", "sinceTime": "2026-12-07T06:30:00Z", "timestamps": "true"
    }  # fmt: skip


def test_a_cursor_passes_on_whole_lines_once_without_their_timestamps() -> None:
    cursor = LogCursor(keep_timestamps=False)
    assert cursor.feed(b"2026-12-07T06:30:00.1Z a\n2026-12-07T06:30:00.1Z b\n2026-12-07T06:3") == b"a\nb\n"
    cursor.reopened()
    assert cursor.feed(b"2026-12-07T06:30:00.1Z a\n2026-12-07T06:30:00.1Z b\n") == b""
    assert cursor.feed(b"2026-12-07T06:30:00.1Z c\n") == b"c\n"  # a third line of that time is new
    assert cursor.feed(b"2026-12-07T06:30:00.2Z d") == b""
    assert cursor.end() == b"d"  # the last line, without its newline
    assert cursor.feed(b"untimed\n") == b"untimed\n"  # passed on as it is
