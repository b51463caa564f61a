"""The bench's --split-cores: the shares of the cores, and real processes pinned to one."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bench.cores import pin, pinned, split


def test_the_cores_are_split_in_contiguous_shares_as_even_as_they_go() -> None:
    assert split([0, 1], 2) == [{0}, {1}]
    assert split([3, 0, 2, 1, 4], 2) == [{0, 1, 2}, {3, 4}]
    assert split([0, 1, 2, 3], 2) == [{0, 1}, {2, 3}]
    with pytest.raises(ValueError, match="1 CPUs cannot be split in 2"):
        split([0], 2)


def test_every_thread_of_a_process_is_pinned_and_set_free_after() -> None:
    everywhere = os.sched_getaffinity(0)
    one = {min(everywhere)}
    # a process with a second thread, made before the pinning
    code = "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{child.pid}/task")) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        tids = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
        with pinned([([child.pid], one)]) as threads:
            assert threads == [len(tids)]
            assert all(os.sched_getaffinity(t) == one for t in tids)
        assert all(os.sched_getaffinity(t) == everywhere for t in tids)
        assert len(pin([child.pid, 2**22 + 1], one)) == len(tids), "a process gone is skipped"
    finally:
        child.kill()
        child.wait()


def test_a_process_that_may_not_be_pinned_stops_the_run_with_its_name() -> None:
    had = os.sched_getaffinity(1)
    one = {min(os.sched_getaffinity(0))}
    if os.geteuid() == 0:  # root may pin anything: a child that drops to nobody may not pin init
        code = (
            "import os, sys; sys.path.insert(0, os.getcwd()); from bench.cores import pin; os.setuid(65534)\n"
            "try:\n    pin([1], set(map(int, sys.argv[1:])))\n"
            "except PermissionError as exc:\n    print(exc)"
        )
        out = subprocess.run([sys.executable, "-c", code, *map(str, one)], capture_output=True, text=True,
                             timeout=30)  # fmt: skip
        assert "may not pin process 1" in out.stdout, out.stderr
    else:
        with pytest.raises(PermissionError, match="may not pin process 1"):
            pin([1], one)
    assert os.sched_getaffinity(1) == had, "nothing was left pinned"
