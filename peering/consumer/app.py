"""The consumer agent, as supervised tasks: the VirtualNode supervisor, the grant follower, the
gateway key exchange and the approver of the virtual kubelets' serving certificates."""

from __future__ import annotations

from pathlib import Path

from kube.clients import KubeClient
from kube.tasks import run_supervised

from ..virtualnodes import SupervisorSettings, VirtualNodeSupervisor
from .csrs import KubeletCsrApprover
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
    roots = {
        "virtual_kubelets": VirtualNodeSupervisor(client, settings).run(),
        "follow_grants": GrantFollower(client, namespace).run(),
        "exchange_gateway_keys": KeyExchange(client, namespace).run(),
    }
    if not kubelet_self_approve:  # the agent checks and approves its kubelets' serving certificates
        roots["approve_kubelet_csrs"] = KubeletCsrApprover(client, namespace).run()
    await run_supervised(roots)
