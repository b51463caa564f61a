"""What one API request costs the API server and etcd of a local cluster, by kind: a kubelet's
TokenRequest for a pod's service-account token, the virtual kubelet's token Secret, and a
ConfigMap for comparison.

``bench.offload`` counts requests per pod; this says what each costs the machine. Its first
use: kwok's nodes, which run the direct baseline, ask no token for their pods, where a real
kubelet asks one per pod (bound to the pod, as here). An offloaded pod pays that request on the
consumer (the virtual kubelet asks it, as the consumer's kubelet would) and writes the token
to the provider as a Secret.

Each pass makes ``--requests`` requests of one kind, ``--concurrency`` at a time, in a namespace
of its own; kinds alternate, ``--rounds`` times. The CPU of the cluster's API server and etcd
over a pass (from /proc), less what they spent at rest for as long (measured first), divided by
the requests, is the cost; the figures are the medians of the rounds.

    make demo
    .venv/bin/python -m bench.request_costs --profile demo
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from bench import machine
from bench.offload import TimedOut
from bench.scratch import PROFILES, gather_limited, kubeconfig_of, run_bench, scratch_namespace
from kube.clients import KubeClient
from kube.objects import CONFIGMAPS, PODS, SECRETS, SERVICEACCOUNTS, ObjectKey, RawObject
from kube.settings import ClientSettings
from kube.watching import present_after, watch_objects

KINDS = ("token", "secret", "configmap")
TOKEN_BYTES = 1000
"""About the size of a bound service-account token (a signed JWT)."""


@dataclass(frozen=True)
class Cost:
    """Milliseconds of CPU per request: the API server's, etcd's, and the whole machine's."""

    apiserver: float
    etcd: float
    machine: float


def net_cost(burst: machine.Burst, rest: machine.Burst, rest_seconds: float, seconds: float,
             requests: int, cluster: str) -> Cost:  # fmt: skip
    """The cost per request of a pass of ``requests`` that lasted ``seconds`` (``burst``), less
    what the same processes spent at rest (``rest``, over ``rest_seconds``) for as long. Pure."""
    scale = seconds / rest_seconds if rest_seconds > 0 else 0.0

    def per_request(spent: float, idle: float) -> float:
        return max(spent - idle * scale, 0.0) / requests * 1000

    def of(component: str) -> float:
        return per_request(burst.by.get(component, 0.0), rest.by.get(component, 0.0))

    return Cost(
        apiserver=of(f"kube-apiserver ({cluster})"),
        etcd=of(f"etcd ({cluster})"),
        machine=per_request(burst.busy, rest.busy),
    )


def _medians(rounds: int) -> str:
    return f"medians of {rounds} rounds" if rounds > 1 else "1 round"


def summary(costs: dict[str, list[Cost]]) -> list[str]:
    """One line per kind with its medians, then how a token compares with a Secret. Pure."""
    med = {
        kind: Cost(*(statistics.median(getattr(c, f) for c in got) for f in ("apiserver", "etcd", "machine")))
        for kind, got in costs.items()
        if got
    }
    lines = [
        f"{kind}: the API server {c.apiserver:.2f} ms, etcd {c.etcd:.2f} ms, the machine "
        f"{c.machine:.2f} ms of CPU per request ({_medians(len(costs[kind]))})"
        for kind, c in med.items()
    ]
    if "token" in med and "secret" in med and med["secret"].machine > 0:
        t, s = med["token"], med["secret"]
        lines.append(
            f"a kubelet's TokenRequest costs the machine {t.machine:.2f} ms, "
            f"{t.machine / s.machine:.2f}x a Secret's creation ({s.machine:.2f} ms)"
        )
    return lines


def at_rest(rest: machine.Burst, seconds: float, top: int = 4) -> str:
    """``at rest over 5s: cores 7 % busy (kube-apiserver (provider) 3.2 %, …)``: what is
    subtracted from each pass, as shares of a core. Pure."""
    share = rest.busy / rest.total * 100 if rest.total > 0 else 0.0
    parts = ", ".join(f"{name} {spent / seconds * 100:.1f} %" for name, spent in rest.by.most_common(top))
    return f"at rest over {seconds:.0f}s: cores {share:.0f} % busy ({parts or 'nothing'} of a core)"


def gated_pod(name: str) -> RawObject:
    """A pod no scheduler places and no controller touches (a scheduling gate holds it): what
    the tokens are bound to, as a kubelet binds a pod's token to the pod."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulingGates": [{"name": "bench.gpuferry.io/hold"}],
            "containers": [{"name": "c", "image": "registry.invalid/none"}],
        },
    }


def token_request(pod: RawObject) -> RawObject:
    """A TokenRequest as a kubelet makes one for a pod's projected token."""
    meta = pod["metadata"]
    return {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "audiences": [],
            "expirationSeconds": 3607,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]},
        },
    }


Request = Callable[[int], Awaitable[object]]
"""Request number i of a pass."""


def one_request(c: KubeClient, kind: str, ns: str, pod: RawObject, tag: str) -> Request:
    if kind == "token":
        body = token_request(pod)
        return lambda i: c.create(SERVICEACCOUNTS, body, ns, name="default", subresource="token")
    data = "x" * TOKEN_BYTES
    resource, field = (SECRETS, "stringData") if kind == "secret" else (CONFIGMAPS, "data")
    return lambda i: c.create(resource, {"metadata": {"name": f"{tag}-{i}"}, field: {"token": data}}, ns)


async def timed_pass(one: Request, requests: int, concurrency: int) -> tuple[machine.Burst, float]:
    before, start = machine.snapshot(), time.monotonic()
    await gather_limited(requests, concurrency, one)
    return machine.snapshot().since(before), time.monotonic() - start


async def wait_account(c: KubeClient, ns: str, timeout: float = 60.0) -> None:
    """Until the namespace's default ServiceAccount exists (the controller-manager makes it),
    watched; :class:`TimedOut` after ``timeout`` seconds."""
    present: frozenset[ObjectKey] = frozenset()
    try:
        async with asyncio.timeout(timeout):
            async for item in watch_objects(c, SERVICEACCOUNTS, namespace=ns,
                                            field_selector="metadata.name=default"):  # fmt: skip
                present = present_after(present, item)
                if present:
                    return
    except TimeoutError:
        raise TimedOut(f"no ServiceAccount default in {ns} after {timeout:.0f}s") from None


async def main(kubeconfig: Path, cluster: str, requests: int, concurrency: int, rounds: int,
               rest_seconds: float) -> None:  # fmt: skip
    costs: dict[str, list[Cost]] = {kind: [] for kind in KINDS}
    async with (
        KubeClient.from_kubeconfig(kubeconfig, settings=ClientSettings(qps=0)) as c,
        scratch_namespace(c, "bench-requests") as ns,
    ):
        try:
            await wait_account(c, ns)
            pod = await c.create(PODS, gated_pod("bound-to"), ns)
            for kind in KINDS:  # warm: connections, the server's caches
                await timed_pass(one_request(c, kind, ns, pod, f"warm-{kind}"), 2 * concurrency, concurrency)
            before = machine.snapshot()
            await asyncio.sleep(rest_seconds)
            rest = machine.snapshot().since(before)
            print(at_rest(rest, rest_seconds), flush=True)
            for r in range(rounds):
                for kind in KINDS:
                    one = one_request(c, kind, ns, pod, f"{kind}{r}")
                    burst, seconds = await timed_pass(one, requests, concurrency)
                    costs[kind].append(net_cost(burst, rest, rest_seconds, seconds, requests, cluster))
                    got = costs[kind][-1]
                    print(f"  round {r + 1} {kind}: {requests} in {seconds:.1f}s, the API server "
                          f"{got.apiserver:.2f} ms, etcd {got.etcd:.2f}, the machine {got.machine:.2f} "
                          "per request", flush=True)  # fmt: skip
        finally:
            for line in summary(costs):  # what the rounds so far got, also when stopped
                print(line, flush=True)


def cli(argv: list[str] | None = None) -> int:
    about = (__doc__ or "").split("\n\n")[0]
    p = argparse.ArgumentParser(prog="python -m bench.request_costs", description=about)
    p.add_argument("--profile", default="demo", choices=PROFILES,
                   help="local clusters to use (default: demo; make demo first)")  # fmt: skip
    p.add_argument("--cluster", default="consumer", choices=["consumer", "provider"])
    p.add_argument("--requests", type=int, default=1000, help="requests per pass")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight (the vk: 16 pod workers)")
    p.add_argument("--rounds", type=int, default=3, help="passes of each kind, alternating")
    p.add_argument("--rest", type=float, default=5.0, help="seconds at rest measured first (default 5)")
    args = p.parse_args(argv)
    if args.requests < 1 or args.concurrency < 1 or args.rounds < 1 or args.rest <= 0:
        p.error("--requests, --concurrency and --rounds must be at least 1, --rest above 0")
    kubeconfig = kubeconfig_of(args.profile, args.cluster)
    if kubeconfig is None:
        return 1
    return run_bench(main(kubeconfig, args.cluster, args.requests, args.concurrency, args.rounds, args.rest))


if __name__ == "__main__":
    sys.exit(cli())
