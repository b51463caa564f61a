"""The consumer agent: the VirtualNode supervisor and the grant follower, as supervised tasks."""

from __future__ import annotations

from pathlib import Path

from kube.clients import KubeClient
from kube.tasks import run_supervised

from ..virtualnodes import SupervisorSettings, VirtualNodeSupervisor
from .grants import GrantFollower
from .keys import KeyExchange


async def run_consumer(
    client: KubeClient,
    *,
    kubeconfig: Path | None,
    namespace: str | None,
    log_dir: Path | None,
    kubelet_self_approve: bool = False,
) -> None:
    settings = SupervisorSettings(
        consumer_kubeconfig=kubeconfig,
        namespace=namespace,
        log_dir=log_dir,
        kubelet_self_approve=kubelet_self_approve,
    )
    await run_supervised(
        {
            "virtual_kubelets": VirtualNodeSupervisor(client, settings).run(),
            "follow_grants": GrantFollower(client, namespace).run(),
            "exchange_gateway_keys": KeyExchange(client, namespace).run(),
        }
    )
