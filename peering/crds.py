"""Installing gpuferry's CustomResourceDefinitions on a cluster that lacks them.

The YAML in ``charts/gpuferry/crds`` is the single source of truth; the chart installs the same
files. They are applied with server-side apply (field manager ``gpuferry``), so a second run is
a no-op and a newer schema replaces an older one.

Each CRD carries its schema's revision (annotation ``gpuferry.io/schema-revision``, an integer
raised with every change of its ``spec``; ``tests/unit/peering/test_crd_schemas.py`` holds the
record). A CRD on the cluster with a higher revision than this gpuferry's is left as it is: a
CLI older than the gpuferry installed (``gpuferry peer`` from an old laptop) would otherwise put
its older schema back, and the API server would prune what only the newer one keeps from every
object written after. One without the annotation (installed before revisions) is older.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from kube.clients import KubeClient
from kube.errors import NotFound
from kube.objects import CRDS, RawObject
from kube.watching import Listed, watch_objects

FIELD_MANAGER = "gpuferry"
REVISION_ANNOTATION = "gpuferry.io/schema-revision"

logger = logging.getLogger(__name__)


def schema_revision(crd: RawObject) -> int:
    """The gpuferry schema revision ``crd`` is stamped with; 0 without one (or an unreadable one)."""
    value = ((crd.get("metadata") or {}).get("annotations") or {}).get(REVISION_ANNOTATION)
    try:
        return int(value) if value is not None else 0
    except (TypeError, ValueError):
        return 0


def newer_on_cluster(installed: RawObject | None, ours: RawObject) -> str | None:
    """Why ``ours`` must not replace ``installed`` (a newer schema revision), or None."""
    if installed is None or schema_revision(installed) <= schema_revision(ours):
        return None
    return (
        f"{ours['metadata']['name']} is kept at schema revision {schema_revision(installed)}: this "
        f"gpuferry has revision {schema_revision(ours)}, older (upgrade this gpuferry; to go back "
        "to the older schema on purpose, apply its CRD files yourself)"
    )


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


@dataclass(frozen=True)
class EnsuredCrds:
    """What :func:`ensure_crds` did: every CRD is Established, each applied or kept as it was."""

    applied: list[str]
    kept: list[str]
    """Those the cluster has at a newer schema revision than this gpuferry's."""

    @property
    def names(self) -> list[str]:
        return sorted([*self.applied, *self.kept])

    def summary(self, what: str) -> str:
        """``6 {what} and Established``, or, where some were kept, ``5 {what}, 1 kept at a newer
        schema revision; all Established``. Pure."""
        if not self.kept:
            return f"{len(self.applied)} {what} and Established"
        kept = f"{len(self.kept)} kept at a newer schema revision"
        return f"{len(self.applied)} {what}, {kept}; all Established"


async def ensure_crds(
    client: KubeClient,
    crds: list[RawObject] | None = None,
    *,
    timeout: float = 60.0,
    progress: Callable[[str], None] = lambda _: None,
    warn: Callable[[str], None] = logger.warning,
) -> EnsuredCrds:
    """Apply every CRD, except where the cluster has a newer schema revision of it (``warn`` says
    so), and wait until all are Established."""
    wanted = crds if crds is not None else load_crds()
    names = [str(c["metadata"]["name"]) for c in wanted]
    kept: list[str] = []
    for crd in wanted:
        try:
            current: RawObject | None = await client.get(CRDS, str(crd["metadata"]["name"]))
        except NotFound:
            current = None
        if (why := newer_on_cluster(current, crd)) is not None:
            warn(why)
            kept.append(str(crd["metadata"]["name"]))
            continue
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
    return EnsuredCrds([n for n in names if n not in kept], kept)
