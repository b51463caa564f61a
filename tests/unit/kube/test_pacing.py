"""Pacing of costly passes: the rest after a pass follows its duration."""

from __future__ import annotations

import pytest

from kube.pacing import Pacer


def test_the_first_pass_starts_at_once() -> None:
    assert Pacer().wait(now=123.0) == 0.0


def test_the_next_pass_rests_factor_times_the_last_ones_duration() -> None:
    pacer = Pacer(factor=4.0, cap=2.0)
    pacer.record(started=10.0, ended=10.1)  # 0.1 s: rest 0.4 s after its end
    assert pacer.wait(now=10.1) == pytest.approx(0.4)
    assert pacer.wait(now=10.3) == pytest.approx(0.2)
    assert pacer.wait(now=10.5) == 0.0
    assert pacer.wait(now=11.0) == 0.0


def test_a_cheap_pass_hardly_waits_and_a_slow_one_waits_at_most_the_cap() -> None:
    pacer = Pacer(factor=4.0, cap=2.0)
    pacer.record(started=0.0, ended=0.005)
    assert pacer.wait(now=0.005) == pytest.approx(0.02)
    pacer.record(started=1.0, ended=4.0)  # 3 s (a loaded machine): not 12 s of rest
    assert pacer.wait(now=4.0) == pytest.approx(2.0)


def test_passes_take_at_most_a_fifth_of_the_time_at_factor_four() -> None:
    pacer, now, busy = Pacer(factor=4.0, cap=10.0), 0.0, 0.0
    for _ in range(100):  # asked for all the time: each pass as soon as it may
        now += pacer.wait(now)
        pacer.record(started=now, ended=now + 0.11)
        now, busy = now + 0.11, busy + 0.11
    assert busy / now == pytest.approx(0.2, rel=0.01)


def test_factor_zero_is_no_pacing_and_negative_settings_are_refused() -> None:
    pacer = Pacer(factor=0.0)
    pacer.record(started=0.0, ended=1.0)
    assert pacer.wait(now=1.0) == 0.0
    with pytest.raises(ValueError, match="not negative"):
        Pacer(factor=-1.0)
