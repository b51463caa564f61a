"""Drive the real fabric (netfabric.gateway and netfabric.agent) on a `Topology`.

Each side reads the other's PeerNetwork object (a raw dict, as the API server would return it),
plans its gateway from it and applies it in its gateway namespace, then its node agents route
the remapped CIDRs to the gateway. Cluster a is the consumer (WireGuard client, dials b), b the
provider (WireGuard server on 172.30.0.2:51820).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from netfabric.agent import AgentSettings, sync_node, teardown_node
from netfabric.gateway import GatewayPlan, GatewaySettings, gateway_down
from netfabric.keys import generate_private_key, public_key
from netfabric.model import ClusterNetwork
from netfabric.nat import table_name_for
from netfabric.reconciling import Reconciled, reconcile_peer, refresh_status

from .topology import GATEWAY_IP, NODE2_IP, POD_CIDR, SERVICE_CIDR, WAN, WG_PORT, Cluster, Topology

LOCAL = ClusterNetwork.from_strings([POD_CIDR], [SERVICE_CIDR])


def peer_object(
    cluster_id: str, key: str, *, endpoint: dict[str, Any] | None = None, mode: str = "Gateway", **extra: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "clusterID": cluster_id,
        "podCIDRs": [POD_CIDR],
        "serviceCIDRs": [SERVICE_CIDR],
        "publicKey": key,
        "sourceNatMode": mode,
        "mtu": 1420,
        "keepaliveSeconds": 25,
    }
    if endpoint is not None:
        spec["endpoint"] = endpoint
    spec.update(extra)
    return {"apiVersion": "net.gpuferry.io/v1alpha1", "kind": "PeerNetwork", "spec": spec}


@dataclass
class Side:
    cluster: Cluster
    cluster_id: str
    private_key: str
    settings: GatewaySettings
    peer: dict[str, Any] = field(default_factory=dict)
    """The other side's PeerNetwork object, as this side sees it."""
    status: dict[str, Any] = field(default_factory=dict)
    """What the reconciler wrote into that object's status so far."""
    plan: GatewayPlan | None = None

    @property
    def public_key(self) -> str:
        return public_key(self.private_key)

    @property
    def table_name(self) -> str:
        return table_name_for(self.peer["spec"]["clusterID"])

    def agents(self) -> list[AgentSettings]:
        return [
            AgentSettings(next_hop=NODE2_IP, netns=self.cluster.ns("n1")),
            AgentSettings(next_hop=GATEWAY_IP, dev="vgw", netns=self.cluster.ns("n2")),
        ]


@dataclass
class Fabric:
    a: Side
    b: Side

    @property
    def sides(self) -> tuple[Side, Side]:
        return (self.a, self.b)

    def publish(self, *, b_mode: str = "Gateway", a_mode: str = "Gateway") -> None:
        """Each side publishes its key (and b its endpoint) into the other's PeerNetwork."""
        self.a.peer = peer_object(
            self.b.cluster_id,
            self.b.public_key,
            endpoint={"address": str(WAN["b"]), "port": WG_PORT},
            mode=a_mode,
        )
        self.b.peer = peer_object(self.a.cluster_id, self.a.public_key, mode=b_mode)


def make_fabric(topo: Topology) -> Fabric:
    def side(cluster: Cluster, listen_port: int | None) -> Side:
        return Side(
            cluster=cluster,
            cluster_id=f"{cluster.name}-{topo.rid}",
            private_key=generate_private_key(),
            settings=GatewaySettings(
                iface=cluster.iface, gateway_ip=GATEWAY_IP, netns=cluster.gw, listen_port=listen_port
            ),
        )

    fabric = Fabric(a=side(topo.a, None), b=side(topo.b, WG_PORT))
    fabric.publish()
    return fabric


async def side_up(side: Side, *, expect_ready: bool = True) -> Reconciled:
    """One reconcile pass of this side's gateway for its PeerNetwork, then its node agents."""
    obj = {**side.peer, "status": side.status}
    result = await reconcile_peer(obj, local=LOCAL, private_key=side.private_key, settings=side.settings)
    side.status.update(result.status)
    if result.plan is None:
        assert not expect_ready, result.condition.message
        return result
    for agent in side.agents():
        await sync_node(result.plan.remaps, settings=agent)
    side.plan = result.plan
    return result


async def record_status(side: Side) -> dict[str, Any]:
    """A periodic status pass: what the controller writes while the tunnel runs."""
    assert side.plan is not None
    result = await refresh_status({**side.peer, "status": side.status}, side.plan, settings=side.settings,
                                  up_since=None)
    side.status.update(result.status)
    return side.status


async def side_down(side: Side) -> None:
    for agent in side.agents():
        await teardown_node(settings=agent)
    await gateway_down(side.settings, table_name=side.table_name)


async def fabric_up(fabric: Fabric) -> None:
    # The server first, so the client's first handshake finds it.
    await side_up(fabric.b)
    await side_up(fabric.a)


async def fabric_down(fabric: Fabric) -> None:
    for side in fabric.sides:
        await side_down(side)
