"""Network-namespace tests: root, real ``ip netns``, real wireguard-go and nftables.

They skip only when not root *and* not in CI (like the nft check in tests/unit/netfabric); in CI,
which runs as root with hack/setup.sh's packages, a missing tool fails them instead.
Every test builds its own namespaces with a random run id and removes them in a finalizer, so a
failed test never leaves anything for the next one.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Iterator

import pytest

from netfabric.wireguard import find_wireguard_go

from .fabric import Fabric, fabric_down, make_fabric
from .topology import Topology, two_clusters

CAN_RUN = os.geteuid() == 0 and all(shutil.which(tool) for tool in ("ip", "nft", "ping", "sysctl"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/netns/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.netns)


@pytest.fixture(autouse=True)
def _can_make_namespaces() -> None:
    """Every test here makes network namespaces: without root and the tools it fails, saying so."""
    assert CAN_RUN, "the netns tests need root, iproute2, nft, ping and sysctl (hack/setup.sh installs them)"


@pytest.fixture
def topo() -> Iterator[Topology]:
    assert find_wireguard_go() is not None, "wireguard-go is missing: run hack/setup.sh"
    with two_clusters() as topology:
        yield topology


@pytest.fixture
async def fabric(topo: Topology) -> AsyncIterator[Fabric]:
    """Keys and objects for both sides (not yet up); always torn down afterwards."""
    made = make_fabric(topo)
    try:
        yield made
    finally:
        await fabric_down(made)
