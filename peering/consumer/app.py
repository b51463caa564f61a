"""The consumer agent on a :class:`kube.manager.Manager`.

Controllers, each while this replica holds the agent's Lease:

* ``foreign_clusters`` (:mod:`.foreignclusters`): a peering per ForeignCluster of a provider —
  identity, GPU slice, VirtualNode, network — woken by its objects here and by a watch of its
  Tenant and GPUSlice on the provider;
* ``namespace_offloadings`` (:mod:`.offloadings`): offloaded namespaces and their twin namespaces;

* ``virtual_kubelets`` (:mod:`.kubelets`), in a cluster: one virtual-kubelet Deployment per
  VirtualNode;

and tasks: outside a cluster, one virtual kubelet process per VirtualNode instead
(:mod:`peering.virtualnodes`); the approver of their serving certificates (:mod:`.csrs`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

from kube.api import NODE_TYPE_LABEL, NODE_TYPE_VIRTUAL_KUBELET, PROVIDER_LABEL, SYSTEM_NAMESPACE
from kube.clients import KubeClient
from kube.declaration import DECLARATION_NAME, DECLARATION_NAMESPACE
from kube.informers import Change, Informer
from kube.manager import Controller, Manager
from kube.objects import (
    CONFIGMAPS,
    DEPLOYMENTS,
    FOREIGNCLUSTERS,
    NAMESPACES,
    NODES,
    PEERNETWORKS,
    PODS,
    VIRTUALNODES,
    ObjectKey,
    RawObject,
    labels,
    meta,
)
from kube.queueing import KeyedQueue
from kube.settings import LeaderElectionSettings, ProbeSettings, QueueSettings
from kube.watching import Listed, WatchEvent

from ..admission import OFFLOADING_NAME
from ..clusterid import CLUSTER_ID_CONFIGMAP
from ..conditions import find_condition
from ..kubeletworkload import COMPONENT, KubeletWorkloadSettings
from ..offloadstatus import UNREACHABLE
from ..resources import NAMESPACEOFFLOADINGS
from ..virtualnodes import SupervisorSettings, VirtualNodeSupervisor
from .csrs import KubeletCsrApprover
from .foreignclusters import ForeignClusterReconciler
from .kubelets import VirtualKubeletDeployer, virtual_node_key
from .offloadings import (
    NamespaceOffloadingReconciler,
    namespace_state,
    provider_unreachable,
    selection_changed,
)
from .providers import ProviderClients, ProviderWatches

__all__ = [
    "LEASE_NAME",
    "build_consumer",
    "offloadings_concerned",
    "offloadings_it_leaves",
    "offloadings_woken",
    "peering_concerned",
    "provider_came_back",
]

logger = logging.getLogger(__name__)

LEASE_NAME = "gpuferry-consumer"


def _ready(node: RawObject) -> str | None:
    cond = find_condition((node.get("status") or {}).get("conditions"), "Ready")
    return None if cond is None else str(cond.get("status"))


def peering_concerned(change: Change) -> bool:
    """Whether a change of a virtual Node concerns its provider's peering, which reads the
    node's readiness and finds it by its provider label: a node that comes or goes, or a change
    of either. Its status heartbeat (every 10 s per node) and the labels that follow the
    provider's free room (``largest-gpu-block``, several times a second in a burst of pods) do
    not: each woke the peering, and every offloading, which applied the admission policies and
    asked the provider for its twin namespace again. Pure."""
    old, new = change.old, change.new
    if change.type != "MODIFIED" or old is None or new is None:
        return True
    return _ready(old) != _ready(new) or labels(old).get(PROVIDER_LABEL) != labels(new).get(PROVIDER_LABEL)


def offloadings_concerned(change: Change, offloadings: Iterable[RawObject]) -> list[ObjectKey]:
    """The offloadings whose selection a change of a virtual Node changes (see
    :func:`~peering.consumer.offloadings.selection_changed`). Pure."""
    old = None if change.old is None or change.type == "ADDED" else labels(change.old)
    new = None if change.new is None or change.type == "DELETED" else labels(change.new)
    if old == new:
        return []
    return [
        ObjectKey.of(obj)
        for obj in offloadings
        if selection_changed(old, new, (obj.get("spec") or {}).get("clusterSelector"))
    ]


def provider_came_back(change: Change) -> bool:
    """Whether a change of a virtual Node says that its provider, found unreachable, answers
    again: its virtual kubelet took the ``provider-unreachable`` taint off. Pure."""
    old, new = change.old, change.new
    if change.type != "MODIFIED" or old is None or new is None:
        return False
    return provider_unreachable(old) and not provider_unreachable(new)


def offloadings_it_leaves(change: Change, offloadings: Iterable[RawObject]) -> list[ObjectKey]:
    """The offloadings whose status a virtual Node's change makes stale: its provider, found
    unreachable (its virtual kubelet put the ``provider-unreachable`` taint on), has an entry
    there not saying so yet. Their next pass says so at once, not at their resync. Pure."""
    old, new = change.old, change.new
    if change.type != "MODIFIED" or old is None or new is None:
        return []
    if provider_unreachable(old) or not provider_unreachable(new):
        return []
    provider = labels(new).get(PROVIDER_LABEL)
    return [
        ObjectKey.of(obj)
        for obj in offloadings
        if any(
            e.get("clusterID") == provider and e.get("reason") != UNREACHABLE
            for e in (obj.get("status") or {}).get("remoteNamespaces") or []
        )
    ]


REMOTE_ANSWERS = frozenset({"Ready", "Failed"})
"""The phases a provider gives a twin namespace request: its answer."""


def offloadings_woken(item: WatchEvent | Listed, waiting: Iterable[ObjectKey]) -> list[ObjectKey]:
    """The Pending offloadings (``waiting``) that a change of the consumer's twin namespace
    requests on a provider wakes: the request of a namespace answered (Ready, Failed) or gone;
    all of them after a (re)list of the requests, which follows the provider's coming back or
    the watch's. A request named as its origin namespace is. Pure."""
    if isinstance(item, Listed):
        return list(waiting)
    obj = item.object
    if item.type != "DELETED" and (obj.get("status") or {}).get("phase") not in REMOTE_ANSWERS:
        return []  # made a moment ago, not answered yet
    key = ObjectKey(str(meta(obj).get("name")), OFFLOADING_NAME)
    return [key] if key in set(waiting) else []


def build_consumer(
    client: KubeClient,
    *,
    kubeconfig: Path | None,
    namespace: str | None,
    log_dir: Path | None,
    kubelet_self_approve: bool = False,
    node_address: str = "127.0.0.1",
    probes: ProbeSettings | None = None,
    leader_election: LeaderElectionSettings | None = None,
    queue: QueueSettings | None = None,
    kubelet_pods: KubeletWorkloadSettings | None = None,
    kubelet_args: Sequence[str] = (),
) -> Manager:
    """``kubelet_pods``: run the virtual kubelets as Deployments with these settings (in a
    cluster); None: as processes of this agent. ``kubelet_args``: flags every virtual kubelet
    gets (processes mode; a Deployment's are in ``kubelet_pods``)."""
    system = namespace or SYSTEM_NAMESPACE
    queue = queue or QueueSettings(workers=4)
    fc_q: KeyedQueue[ObjectKey] = KeyedQueue("foreign_clusters", settings=queue)
    no_q: KeyedQueue[ObjectKey] = KeyedQueue("namespace_offloadings", settings=queue)

    foreign_clusters = Informer(client, FOREIGNCLUSTERS)
    virtual_node_objects = Informer(client, VIRTUALNODES, namespace=system)
    nodes = Informer(client, NODES, name="virtual-nodes",
                     label_selector=f"{NODE_TYPE_LABEL}={NODE_TYPE_VIRTUAL_KUBELET}")  # fmt: skip
    peer_networks = Informer(client, PEERNETWORKS, namespace=system)
    offloadings = Informer(client, NAMESPACEOFFLOADINGS, field_selector=f"metadata.name={OFFLOADING_NAME}")
    namespaces = Informer(client, NAMESPACES, project=namespace_state)
    cluster_id = Informer(client, CONFIGMAPS, name="cluster-id", namespace=system,
                          field_selector=f"metadata.name={CLUSTER_ID_CONFIGMAP}")  # fmt: skip
    declaration = Informer(client, CONFIGMAPS, name="network-declaration", namespace=DECLARATION_NAMESPACE,
                           field_selector=f"metadata.name={DECLARATION_NAME}")  # fmt: skip

    clients = ProviderClients()

    def peering(provider_id: str | None) -> None:
        if provider_id:
            fc_q.add(ObjectKey(None, provider_id))

    def every_peering(_: Change) -> None:
        for key in foreign_clusters:
            fc_q.add(key)

    offloaded = NamespaceOffloadingReconciler(
        client, virtual_nodes=nodes, clients=clients, namespaces=namespaces
    )

    def node_changed(change: Change) -> None:
        if peering_concerned(change):
            peering(labels(change.object).get(PROVIDER_LABEL))
        # which providers a namespace may use depends on their nodes' labels
        for key in offloadings_concerned(change, offloadings.values()):
            no_q.add(key)
        if provider_came_back(change):  # what waited for its answer asks again now
            for key in offloaded.waiting():
                no_q.add(key)
        for key in offloadings_it_leaves(change, offloadings.values()):  # its status says so now
            no_q.add(key)

    def remote_offloading_changed(_: str, item: WatchEvent | Listed) -> None:
        for key in offloadings_woken(item, offloaded.waiting()):
            no_q.add(key)

    foreign_clusters.add_handler(lambda change: fc_q.add(change.key))
    virtual_node_objects.add_handler(lambda change: peering(change.key.name))
    nodes.add_handler(node_changed)
    peer_networks.add_handler(lambda change: peering(change.key.name))
    offloadings.add_handler(lambda change: no_q.add(change.key))

    def namespace_changed(change: Change) -> None:
        # a namespace being deleted: its offloading (if any) is released at once
        key = ObjectKey(change.key.name, OFFLOADING_NAME)
        if change.new is not None and meta(change.new).get("deletionTimestamp") and key in offloadings:
            no_q.add(key)

    namespaces.add_handler(namespace_changed)
    cluster_id.add_handler(every_peering)
    declaration.add_handler(every_peering)

    watches = ProviderWatches(on_change=peering, on_offloading=remote_offloading_changed)
    peerings = ForeignClusterReconciler(
        client,
        foreign_clusters=foreign_clusters,
        virtual_nodes=virtual_node_objects,
        nodes=nodes,
        peer_networks=peer_networks,
        clients=clients,
        watches=watches,
    )
    manager = Manager(
        "consumer",
        client=client,
        probes_settings=probes or ProbeSettings(port=-1),
        leader_election=leader_election or LeaderElectionSettings(enabled=False, name=LEASE_NAME),
    )
    for informer in (cluster_id, declaration):
        manager.add_informer(informer)
    manager.add_controller(
        Controller(
            "foreign_clusters",
            fc_q,
            peerings,
            kind="ForeignCluster",
            logger=logger,
            informers=[foreign_clusters, virtual_node_objects, nodes, peer_networks],
        )
    )
    manager.add_controller(
        Controller(
            "namespace_offloadings",
            no_q,
            offloaded,
            kind="NamespaceOffloading",
            logger=logger,
            informers=[offloadings, nodes, namespaces],
        )
    )
    if kubelet_pods is not None:
        _add_kubelet_deployments(manager, client, kubelet_pods, virtual_node_objects, queue)
    else:
        settings = SupervisorSettings(
            consumer_kubeconfig=kubeconfig,
            namespace=namespace,
            log_dir=log_dir,
            kubelet_self_approve=kubelet_self_approve,
            node_address=node_address,
            extra_args=tuple(kubelet_args),
        )
        manager.add_task("virtual-kubelets", VirtualNodeSupervisor(client, settings).run)
    if not kubelet_self_approve:  # the agent checks and approves its kubelets' serving certificates
        approver = KubeletCsrApprover(client, namespace, pods=kubelet_pods is not None)
        manager.add_task("approve-kubelet-csrs", approver.run)

    async def close_provider_clients() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await watches.close()
            await clients.close()

    manager.add_task("provider-clients", close_provider_clients, leader_only=False)
    return manager


def _add_kubelet_deployments(
    manager: Manager,
    client: KubeClient,
    settings: KubeletWorkloadSettings,
    virtual_nodes: Informer,
    queue: QueueSettings,
) -> None:
    """The ``virtual_kubelets`` controller: woken by its VirtualNodes and by the Deployments and
    pods of their kubelets (a pod that cannot pull its image shows on the VirtualNode at once)."""
    q: KeyedQueue[ObjectKey] = KeyedQueue("virtual_kubelets", settings=queue)
    ours = f"app.kubernetes.io/component={COMPONENT}"
    deployments = Informer(client, DEPLOYMENTS, name="virtual-kubelet-deployments",
                           namespace=settings.namespace, label_selector=ours)  # fmt: skip
    pods = Informer(client, PODS, name="virtual-kubelet-pods", namespace=settings.namespace,
                    label_selector=ours)  # fmt: skip

    def owner_changed(change: Change) -> None:
        key = virtual_node_key(change.object)
        if key is not None:
            q.add(key)

    virtual_nodes.add_handler(lambda change: q.add(change.key))
    deployments.add_handler(owner_changed)
    pods.add_handler(owner_changed)
    deployer = VirtualKubeletDeployer(client, settings, deployments=deployments, pods=pods)
    controller = Controller("virtual_kubelets", q, deployer, kind="VirtualNode", logger=logger,
                            informers=[virtual_nodes, deployments, pods])  # fmt: skip
    manager.add_controller(controller)
