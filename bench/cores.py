"""Each local cluster on cores of its own, as two real clusters run on machines of their own
(``bench.offload --split-cores``).

Both local clusters share this machine's cores. A direct burst is the provider's control plane's
work; an offloaded one is the consumer's control plane's, the virtual kubelet's and the
provider's: on shared cores the offloaded burst waits for the sum, where two real clusters do
their parts at once, each on its own machines. Pinning every process of a cluster (its control
plane, kwok, its real node and the processes of the node's pods) to its own share of the cores
keeps the direct burst to the provider's cores and lets the consumer's side run beside it. The
bench's virtual kubelet goes with the consumer, where a virtual kubelet runs.

Every thread of a process is pinned (``sched_setaffinity`` applies to one thread; threads made
later inherit their maker's cores). Processes started after the pinning (a pod created on a real
node) are not pinned: the bench's pods run on kwok, which starts none.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

__all__ = ["pin", "pinned", "restore", "split"]


def split(cpus: Sequence[int], parts: int) -> list[set[int]]:
    """``cpus`` in ``parts`` contiguous shares as even as they go (the first ones get the
    remainder). Pure. Fewer CPUs than parts is an error: a share of no core runs nothing."""
    if parts < 1 or len(cpus) < parts:
        raise ValueError(f"{len(cpus)} CPUs cannot be split in {parts}: each share needs one")
    ordered = sorted(cpus)
    size, extra = divmod(len(ordered), parts)
    shares, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        shares.append(set(ordered[start:end]))
        start = end
    return shares


def _threads(pid: int, proc: Path) -> list[int]:
    try:
        return [int(t.name) for t in (proc / str(pid) / "task").iterdir()]
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return []


def pin(pids: Iterable[int], cpus: set[int], proc: Path = Path("/proc")) -> dict[int, set[int]]:
    """Every thread of every process of ``pids`` on ``cpus``; the threads pinned, each with the
    cores it had. A process or thread gone meanwhile is skipped. One this process may not pin
    (another user's, without root) raises PermissionError, naming it: a run that went on would
    be timed on shared cores while it said split."""
    before: dict[int, set[int]] = {}
    for pid in pids:
        for tid in _threads(pid, proc):
            try:
                had = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, cpus)
            except ProcessLookupError:
                continue
            except PermissionError as exc:
                restore(before)
                raise PermissionError(
                    f"--split-cores may not pin process {pid} (thread {tid}): run the bench as the user "
                    f"that runs the clusters, or as root ({exc.strerror})"
                ) from exc
            before[tid] = had
    return before


def restore(before: dict[int, set[int]]) -> None:
    """Each thread back on the cores it had (one gone meanwhile is skipped)."""
    for tid, cpus in before.items():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.sched_setaffinity(tid, cpus)


@contextlib.contextmanager
def pinned(groups: Sequence[tuple[Iterable[int], set[int]]]) -> Iterator[list[int]]:
    """Each group's processes on its cores for the block (yields the threads pinned per group);
    after it, every thread pinned is back on the cores it had."""
    done: list[dict[int, set[int]]] = []
    try:
        for pids, cpus in groups:
            done.append(pin(pids, cpus))
        yield [len(d) for d in done]
    finally:
        for before in done:
            restore(before)
