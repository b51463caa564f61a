"""Installing gpuferry's CustomResourceDefinitions on a cluster that lacks them.

The YAML in ``charts/gpuferry/crds`` is the single source of truth; the chart installs the same
files. They are applied with server-side apply (field manager ``gpuferry``), so a second run is
a no-op and a newer schema replaces an older one.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import yaml

from kube.clients import KubeClient
from kube.errors import NotFound
from kube.objects import CRDS, RawObject
from kube.watching import Listed, watch_objects

FIELD_MANAGER = "gpuferry"


def crd_dir() -> Path:
    """``$GPUFERRY_CRDS_DIR``, else the chart's crds folder (``peering/chart``: a link to
    ``charts/gpuferry`` in the source tree, the chart itself in the wheel)."""
    if env := os.environ.get("GPUFERRY_CRDS_DIR"):
        return Path(env)
    return Path(__file__).parent / "chart" / "crds"


def load_crds(directory: Path | None = None) -> list[RawObject]:
    """Every CRD in ``directory``, sorted by name; FileNotFoundError when there is none."""
    folder = directory or crd_dir()
    crds: list[RawObject] = []
    for path in sorted(folder.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                crds.append(doc)
    if not crds:
        raise FileNotFoundError(f"no CustomResourceDefinition found in {folder} (set GPUFERRY_CRDS_DIR)")
    return sorted(crds, key=lambda c: str(c["metadata"]["name"]))


def _established(crd: RawObject) -> bool:
    for cond in crd.get("status", {}).get("conditions") or []:
        if cond.get("type") == "Established" and cond.get("status") == "True":
            return True
    return False


async def installed(client: KubeClient, crds: list[RawObject]) -> dict[str, bool]:
    """For each CRD name: present and Established on the cluster."""
    found: dict[str, bool] = {}
    for crd in crds:
        name = str(crd["metadata"]["name"])
        try:
            found[name] = _established(await client.get(CRDS, name))
        except NotFound:
            found[name] = False
    return found


async def ensure_crds(
    client: KubeClient,
    crds: list[RawObject] | None = None,
    *,
    timeout: float = 60.0,
    progress: Callable[[str], None] = lambda _: None,
) -> list[str]:
    """Apply every CRD and wait until all are Established; returns their names."""
    wanted = crds if crds is not None else load_crds()
    names = [str(c["metadata"]["name"]) for c in wanted]
    for crd in wanted:
        await client.patch(
            CRDS,
            str(crd["metadata"]["name"]),
            crd,
            patch_type="apply",
            field_manager=FIELD_MANAGER,
            force=True,
        )
        progress(f"applied {crd['metadata']['name']}")
    pending = set(names)

    async def wait() -> None:
        async for item in watch_objects(client, CRDS):
            if isinstance(item, Listed):
                continue
            name = item.key.name
            if name in pending and item.type != "DELETED" and _established(item.object):
                pending.discard(name)
                progress(f"established {name}")
            if not pending:
                return

    try:
        async with asyncio.timeout(timeout):
            await wait()
    except TimeoutError:
        raise TimeoutError(
            f"CRDs not Established after {timeout:.0f}s: {', '.join(sorted(pending))}"
        ) from None
    return names
