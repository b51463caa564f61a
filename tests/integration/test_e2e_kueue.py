"""Kueue for real (issue 18 §3): Kueue v0.10.0, built from the module proxy by hack/, runs against
the consumer with its webhooks (the API server calls them on loopback). ``gpuferry info --kueue``
prints a ResourceFlavor for the provider's virtual node and a ClusterQueue whose quota is the
grant; applied as printed, three one-GPU Jobs in a queue over a two-GPU grant: two are admitted
and run on the virtual node, the third waits in the queue (suspended, not Pending on a full
node) and runs when one of them finishes."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import datetime

import pytest
import yaml

from hack.localcluster import LocalCluster
from hack.localcluster.kueue import start_kueue, stop_kueue
from kube.clients import KubeClient
from kube.objects import JOBS, PODS, RawObject, Resource

from .clirunner import Cli
from .conftest import NamespaceFactory
from .waiting import condition, wait_for, wait_for_items

pytestmark = pytest.mark.integration

H100 = "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"
WORKLOADS = Resource("kueue.x-k8s.io", "v1beta1", "workloads", "Workload", namespaced=True)
JOB = """
apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
  labels: {{kueue.x-k8s.io/queue-name: gpus}}
spec:
  template:
    metadata:
      annotations: {{gpuferry.io/simulate-complete-after: "{seconds}s"}}
    spec:
      restartPolicy: Never
      containers:
      - name: train
        image: nvcr.io/nvidia/pytorch:25.01-py3
        resources: {{limits: {{nvidia.com/gpu: "1"}}}}
"""


@pytest.fixture
def kueue(consumer: LocalCluster) -> Iterator[LocalCluster]:
    start_kueue(consumer, consumer.bin)
    yield consumer
    stop_kueue(consumer)


def when(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def complete(job: RawObject) -> bool:
    return (condition(job, "Complete") or {}).get("status") == "True"


async def test_three_jobs_over_a_two_gpu_grant_queue_in_kueue(
    cli: Cli,
    kueue: LocalCluster,
    consumer_client: KubeClient,
    make_namespace: NamespaceFactory,
) -> None:
    await cli.ok(*cli.peer_args("--gpus", "2", "--selector", H100))
    ns = await make_namespace(consumer_client)
    await cli.ok("offload", "namespace", ns, "--kubeconfig", cli.c, "-q")

    printed = await cli.ok("info", "--kubeconfig", cli.c, "--kueue")
    flavor, queue = list(yaml.safe_load_all(printed))
    assert flavor["kind"] == "ResourceFlavor" and flavor["metadata"]["name"] == "gpuferry-gpu-farm"
    assert queue["kind"] == "ClusterQueue" and queue["metadata"]["name"] == "gpuferry"
    resources = queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    assert {"name": "nvidia.com/gpu", "nominalQuota": "2"} in resources
    local_queue = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
                   "metadata": {"name": "gpus", "namespace": ns},
                   "spec": {"clusterQueue": "gpuferry"}}  # fmt: skip
    kueue.kubectl("apply", "-f", "-", input=printed)
    try:
        kueue.kubectl("apply", "-f", "-", input=json.dumps(local_queue))
        for name, seconds in (("first", 6), ("second", 6), ("third", 2)):
            created = kueue.kubectl("-n", ns, "create", "-f", "-", "-o", "json",
                                    input=JOB.format(name=name, seconds=seconds))  # fmt: skip
            # the webhook suspends it (it names a queue) until Kueue admits it: the API server's
            # answer says so (a read after it may find it admitted already)
            job = json.loads(created)
            assert job["spec"]["suspend"] is True, job["spec"]

        def admitted(job: RawObject) -> bool:
            return job["spec"].get("suspend") is False

        first = await wait_for(consumer_client, JOBS, "first", admitted, namespace=ns, timeout=60)
        await wait_for(consumer_client, JOBS, "second", admitted, namespace=ns, timeout=60)
        third = await consumer_client.get(JOBS, "third", ns)
        assert third["spec"]["suspend"] is True  # no quota left: it waits in the queue
        # Kueue's job controller makes each Job's Workload on its own time: wait for all three
        workloads = await wait_for_items(consumer_client, WORKLOADS, lambda ws: len(ws) == 3,
                                         namespace=ns, timeout=60)  # fmt: skip
        pending = [w for w in workloads if (condition(w, "QuotaReserved") or {}).get("status") != "True"]
        seen = {w["metadata"]["ownerReferences"][0]["name"]: condition(w, "QuotaReserved") for w in workloads}
        assert [w["metadata"]["ownerReferences"][0]["name"] for w in pending] == ["third"], seen

        done = {}
        for name in ("first", "second", "third"):
            done[name] = await wait_for(consumer_client, JOBS, name, complete, namespace=ns, timeout=120)
        # the third started only after one of the first two had finished
        finished = min(when(done[n]["status"]["completionTime"]) for n in ("first", "second"))
        assert when(done["third"]["status"]["startTime"]) >= finished, (done["third"]["status"], finished)
        pods = (await consumer_client.list(PODS, ns))["items"]
        assert len(pods) == 3 and {p["spec"]["nodeName"] for p in pods} == {"gpuferry-gpu-farm"}
        assert first["spec"]["template"]["spec"]["nodeSelector"]["gpuferry.io/provider"] == "gpu-farm"
    finally:
        with contextlib.suppress(RuntimeError):
            kueue.kubectl("-n", ns, "delete", "jobs", "--all", "--wait=false")
        made = (("localqueue", "gpus"), ("clusterqueue", "gpuferry"), ("resourceflavor", "gpuferry-gpu-farm"))
        for kind, name in made:
            kueue.kubectl("delete", kind, name, *(["-n", ns] if kind == "localqueue" else []),
                          "--ignore-not-found", "--wait=false", check=False)  # fmt: skip

