"""What a burst costs the whole machine: CPU by component, and API server writes by all clients.

The local clusters' control planes (both API servers, etcds, schedulers, kwoks) and the virtual
kubelet share this machine's cores. When the cores are busy through a burst, a path's time
follows the work it makes, not only its latency: these figures say how much work each path
made, and who did it. CPU comes from /proc; writes from each API server's own
``apiserver_request_total``, so they count every client (schedulers, kwok, controllers), not
only the virtual kubelet. Leases are left out of the writes: kwok renews one per node every
10 s whatever the pods do.
"""

from __future__ import annotations

import os
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from kube.clients import KubeClient
from kube.errors import KubeError

__all__ = ["Burst", "Snapshot", "component_of", "parse_writes", "snapshot", "writes"]

WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE", "APPLY", "CREATE", "UPDATE"})
BACKGROUND = frozenset({"leases"})
"""Written at a steady rate whatever the pods do (kwok's node heartbeats): left out."""

_TICKS = os.sysconf("SC_CLK_TCK")


def component_of(argv: list[str], *, run_dir: str = "/run/") -> str:
    """A short name for the process ``argv``: the binary, and the local cluster its files are
    under (``kube-apiserver (consumer)``); ``python -m vk`` for a Python module. Pure."""
    if not argv or not argv[0]:
        return "kernel"
    exe = Path(argv[0]).name
    if exe.startswith("python") and "-m" in argv[:-1]:
        return f"python -m {argv[argv.index('-m') + 1]}"
    joined = " ".join(argv)
    cluster = re.search(re.escape(run_dir) + r"[^/ ]+/([^/ ]+)/", joined)
    return f"{exe} ({cluster.group(1)})" if cluster else exe


@dataclass(frozen=True)
class Snapshot:
    """The machine's busy and total CPU seconds (all cores), and each process's CPU seconds."""

    busy: float
    total: float
    processes: dict[int, tuple[str, float]] = field(default_factory=dict)

    def since(self, before: Snapshot, *, names: dict[int, str] | None = None) -> Burst:
        """What happened between ``before`` and this snapshot; ``names`` renames some pids."""
        by: Counter[str] = Counter()
        for pid, (name, seconds) in self.processes.items():
            spent = seconds - before.processes.get(pid, (name, 0.0))[1]
            if spent > 0:
                by[(names or {}).get(pid, name)] += spent
        return Burst(busy=self.busy - before.busy, total=self.total - before.total, by=by)


@dataclass(frozen=True)
class Burst:
    """CPU seconds between two snapshots: the machine's busy and total, and by component."""

    busy: float
    total: float
    by: Counter[str]

    def summary(self, pods: int, *, top: int = 6, always: tuple[str, ...] = ()) -> str:
        """``41.9 ms CPU per pod, cores 95 % busy: kube-apiserver (consumer) 10.8, …``: the
        ``top`` busiest, then those whose names start with one of ``always`` wherever they rank."""
        share = self.busy / self.total * 100 if self.total > 0 else 0.0
        ranked = self.by.most_common()
        shown = [*ranked[:top], *((k, v) for k, v in ranked[top:] if always and k.startswith(always))]
        parts = ", ".join(f"{name} {seconds / pods * 1000:.1f}" for name, seconds in shown)
        return f"{self.busy / pods * 1000:.1f} ms CPU per pod, cores {share:.0f} % busy ({parts} ms)"


def snapshot(proc: Path = Path("/proc")) -> Snapshot:
    """Now: /proc/stat's busy and total CPU time, and every process's user+system time."""
    fields = [int(v) for v in (proc / "stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    busy = (user + nice + system + irq + softirq + steal) / _TICKS
    processes: dict[int, tuple[str, float]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        seconds = (int(stat[11]) + int(stat[12])) / _TICKS
        if seconds > 0:
            name = component_of([a.decode(errors="replace") for a in argv if a])
            processes[int(entry.name)] = (name, seconds)
    return Snapshot(busy=busy, total=busy + (idle + iowait) / _TICKS, processes=processes)


Writes = Counter[str]
"""``"VERB resource[/subresource]"`` -> requests, as an API server counted them."""


def parse_writes(metrics: str) -> Writes:
    """Write requests by verb and resource from an API server's /metrics text. Pure."""
    out: Writes = Counter()
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name != "apiserver_request_total":
                continue
            labels = sample.labels
            if labels.get("verb") not in WRITE_VERBS or labels.get("resource") in BACKGROUND:
                continue
            resource = labels.get("resource") or "?"
            if labels.get("subresource"):
                resource += "/" + labels["subresource"]
            out[f"{labels['verb']} {resource}"] += sample.value
    return out


async def writes(client: KubeClient) -> Writes | None:
    """The write requests the API server of ``client`` has served since it started; None where
    its /metrics cannot be read (an identity not allowed to, say): the run goes on without them."""
    try:
        async with client.stream("GET", "/metrics") as resp:
            return parse_writes(await resp.text())
    except KubeError as exc:
        print(f"API server writes not counted: {client.base_url}/metrics: {exc}", file=sys.stderr)
        return None


def per_pod(done: Writes, pods: int) -> str:
    """``4.00 (POST pods 1.00, …)``: the writes ``done`` per pod, most first. Pure."""
    counts = {k: v / pods for k, v in done.items()}
    counts = {k: v for k, v in counts.items() if v >= 0.005}
    detail = ", ".join(f"{k} {v:.2f}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
    return f"{sum(counts.values()):.2f} ({detail or 'none'})"
