"""One user of a profile's clusters at a time, and a way to tell that the last one did not end.

Two test sessions on the same profile (a developer's run still going when CI starts, say) would
share the API servers and trip over each other's objects. :class:`ProfileLock` is an ``flock`` on
``<run root>/<profile>.lock``: the second session waits for the first, saying who holds it. The
holder also leaves a ``<profile>.dirty`` marker for as long as it holds the lock; a holder that is
killed leaves it behind, so the next one knows that the clusters it finds carry that session's
leftovers (virtual nodes, peerings) and starts them afresh.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from .spec import default_run_root

__all__ = ["ProfileLock", "ProfileLockTimeout"]


class ProfileLockTimeout(RuntimeError):
    """Another session held the profile for longer than we were ready to wait."""


class ProfileLock:
    """``with ProfileLock("test") as lock:`` — ``lock.previous_ended_cleanly`` says whether the
    last holder released it (False: it was killed while holding it)."""

    def __init__(
        self,
        profile: str,
        *,
        run_root: Path | None = None,
        timeout: float = 1800.0,
        poll: float = 2.0,
        progress: Callable[[str], None] = lambda _msg: None,
    ) -> None:
        root = run_root or default_run_root()
        self.path = root / f"{profile}.lock"
        self.dirty = root / f"{profile}.dirty"
        self.profile = profile
        self.timeout = timeout
        self.poll = poll
        self.progress = progress
        self.previous_ended_cleanly = True
        self._fd: int | None = None

    def holder(self) -> str:
        """What the holder wrote into the lock file (pid and working directory), or ``?``."""
        try:
            return self.path.read_text().strip() or "?"
        except OSError:
            return "?"

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.timeout
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise ProfileLockTimeout(
                        f"the clusters of profile {self.profile!r} are in use by {self.holder()} "
                        f"(waited {self.timeout:.0f}s; lock {self.path})"
                    ) from None
                if not told:
                    self.progress(f"waiting for {self.holder()} to finish with profile {self.profile!r}")
                    told = True
                time.sleep(self.poll)
        self._fd = fd
        self.previous_ended_cleanly = not self.dirty.exists()
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} in {Path.cwd()}\n".encode(), 0)
        self.dirty.write_text(f"{os.getpid()}\n")

    def release(self) -> None:
        if self._fd is None:
            return
        self.dirty.unlink(missing_ok=True)
        os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> ProfileLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
