"""Apply and remove our nftables tables, one atomic ``nft -f`` transaction each.

The scripts come from `netfabric.nat` (pure). A script either applies completely or not at all
(nft's transactions are atomic), so a failed apply leaves the previous table untouched.
"""

from __future__ import annotations

import json

from netfabric.nat import TABLE_PREFIX, render_delete
from netfabric.nsexec import CommandError, run

__all__ = ["NftError", "apply_script", "delete_table", "list_tables"]


class NftError(RuntimeError):
    """nft refused a script; the message carries nft's own explanation."""


async def apply_script(script: str, *, netns: str | None = None) -> None:
    """Apply one ``nft -f`` script as a single transaction."""
    try:
        await run(["nft", "-f", "-"], netns=netns, stdin=script)
    except CommandError as e:
        raise NftError(f"nft -f refused the script: {e.stderr.strip()}") from e


async def delete_table(table_name: str, *, netns: str | None = None) -> None:
    """Remove a table of ours with all its chains; succeeds when it is already gone."""
    await apply_script(render_delete(table_name), netns=netns)


async def list_tables(*, netns: str | None = None, prefix: str = TABLE_PREFIX) -> list[str]:
    """Names of the ``ip`` tables whose name starts with ``prefix`` (ours by default)."""
    out = await run(["nft", "-j", "list", "tables", "ip"], netns=netns)
    names = []
    for item in json.loads(out).get("nftables", []):
        table = item.get("table")
        if table and table.get("family") == "ip" and str(table.get("name", "")).startswith(prefix):
            names.append(str(table["name"]))
    return names
