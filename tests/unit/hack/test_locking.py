"""The profile lock: one session at a time, and a killed holder is noticed by the next."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hack.localcluster.locking import ProfileLock, ProfileLockTimeout


def test_a_second_holder_waits_then_gives_up_naming_the_first(tmp_path: Path) -> None:
    said: list[str] = []
    with ProfileLock("test", run_root=tmp_path):
        second = ProfileLock("test", run_root=tmp_path, timeout=0.3, poll=0.05, progress=said.append)
        with pytest.raises(ProfileLockTimeout, match=r"in use by pid \d+ in "):
            second.acquire()
    assert said and "waiting for pid" in said[0]
    with ProfileLock("test", run_root=tmp_path, timeout=0.3) as again:  # released: free at once
        assert again.previous_ended_cleanly


def test_profiles_do_not_share_a_lock(tmp_path: Path) -> None:
    demo = ProfileLock("demo", run_root=tmp_path, timeout=0.1)  # times out if it were the same lock
    with ProfileLock("test", run_root=tmp_path) as test, demo:
        assert test.holder().startswith("pid ") and demo.holder().startswith("pid ")


def test_a_killed_holder_leaves_the_next_one_told(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from hack.localcluster.locking import ProfileLock
        ProfileLock("test", run_root=Path({str(tmp_path)!r})).acquire()
        print("held", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        with pytest.raises(ProfileLockTimeout):
            ProfileLock("test", run_root=tmp_path, timeout=0.2, poll=0.05).acquire()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with ProfileLock("test", run_root=tmp_path, timeout=5) as lock:
        assert not lock.previous_ended_cleanly
    with ProfileLock("test", run_root=tmp_path, timeout=5) as lock:
        assert lock.previous_ended_cleanly
