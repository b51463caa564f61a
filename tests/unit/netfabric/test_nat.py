from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

import pytest

from netfabric.model import NetworkConfigError, Remap, SourceNatMode
from netfabric.nat import (
    DEFAULT_FWMARK,
    TABLE_PREFIX,
    render_delete,
    render_nat_table,
    table_name_for,
)

N = IPv4Network
GATEWAY_IP = IPv4Address("10.244.3.4")
REMAPS = [
    Remap(N("10.244.0.0/16"), N("10.70.0.0/16")),
    Remap(N("10.96.0.0/16"), N("10.71.0.0/16")),
    Remap(N("192.168.0.0/24"), N("192.168.0.0/24")),
]


def render(mode: SourceNatMode = SourceNatMode.GATEWAY, remaps: list[Remap] = REMAPS) -> str:
    return render_nat_table(
        "gpuferry_b", tunnel_iface="gf-b", remaps=remaps, snat_mode=mode, gateway_ip=GATEWAY_IP
    )


def chain(script: str, name: str) -> list[str]:
    """The rule lines of one chain (after its type line)."""
    lines = script.splitlines()
    start = lines.index(f"\tchain {name} {{")
    end = lines.index("\t}", start)
    return [line.strip() for line in lines[start + 2 : end]]


def test_script_replaces_the_table_atomically() -> None:
    body = [line for line in render().splitlines() if not line.startswith("#")]
    assert body[:3] == ["table ip gpuferry_b {}", "delete table ip gpuferry_b", "table ip gpuferry_b {"]
    assert body[-1] == "}"
    assert render() == render()  # deterministic


def test_chain_hooks_and_priorities() -> None:
    script = render()
    assert "\tchain steer {\n\t\ttype filter hook prerouting priority mangle; policy accept;" in script
    assert "\tchain prerouting {\n\t\ttype nat hook prerouting priority dstnat; policy accept;" in script
    assert "\tchain postrouting {\n\t\ttype nat hook postrouting priority srcnat; policy accept;" in script
    assert "\tchain clamp {\n\t\ttype filter hook forward priority mangle; policy accept;" in script


def test_tcp_mss_is_clamped_to_the_tunnel_mtu() -> None:
    assert chain(render(), "clamp") == [
        'oifname "gf-b" tcp flags & (syn | rst) == syn tcp option maxseg size set rt mtu'
    ]


def test_outbound_prefix_dnat_from_local_view_to_original_skips_identity() -> None:
    assert chain(render(), "prerouting") == [
        'iifname != "gf-b" ip daddr 10.70.0.0/16 dnat ip prefix to 10.244.0.0/16',
        'iifname != "gf-b" ip daddr 10.71.0.0/16 dnat ip prefix to 10.96.0.0/16',
    ]


def test_tunnel_connections_are_marked_and_steered() -> None:
    mark = f"{DEFAULT_FWMARK:#010x}"
    rules = chain(render(), "steer")
    assert rules == [
        f'iifname "gf-b" ct state new ct mark set ct mark and 0xff00ffff or {mark}',
        'iifname != "gf-b" ct state new ip daddr { 10.70.0.0/16, 10.71.0.0/16, 192.168.0.0/24 }'
        f" ct mark set ct mark and 0xff00ffff or {mark}",
        f'iifname != "gf-b" ct mark and 0x00ff0000 == {mark}'
        f" meta mark set meta mark and 0xff00ffff or {mark}",
    ]


def test_gateway_mode_snats_tunnel_traffic_to_the_gateway_ip() -> None:
    assert chain(render(SourceNatMode.GATEWAY), "postrouting") == [
        'iifname "gf-b" oifname != "gf-b" snat ip to 10.244.3.4'
    ]


def test_preserve_mode_prefix_snats_overlapping_sources_only() -> None:
    assert chain(render(SourceNatMode.PRESERVE), "postrouting") == [
        'iifname "gf-b" oifname != "gf-b" ip saddr 10.244.0.0/16 snat ip prefix to 10.70.0.0/16',
        'iifname "gf-b" oifname != "gf-b" ip saddr 10.96.0.0/16 snat ip prefix to 10.71.0.0/16',
    ]


def test_preserve_mode_needs_no_gateway_ip() -> None:
    script = render_nat_table(
        "gpuferry", tunnel_iface="wg0", remaps=REMAPS, snat_mode=SourceNatMode.PRESERVE, gateway_ip=None
    )
    assert "snat ip to" not in script


def test_no_remaps_renders_a_valid_minimal_table() -> None:
    script = render(remaps=[])
    assert chain(script, "prerouting") == []
    assert [rule for rule in chain(script, "steer") if "daddr" in rule] == []


def test_custom_fwmark() -> None:
    script = render_nat_table(
        "gpuferry_b",
        tunnel_iface="gf-b",
        remaps=REMAPS,
        gateway_ip=GATEWAY_IP,
        fwmark=0x200,
        fwmark_mask=0xF00,
    )
    assert "ct mark set ct mark and 0xfffff0ff or 0x00000200" in script


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"table_name": "mark"}, "table_name"),
        ({"table_name": "gpuferry-b"}, "table_name"),
        ({"table_name": "gpuferry_B"}, "table_name"),
        ({"tunnel_iface": 'wg"0'}, "tunnel_iface"),
        ({"tunnel_iface": "a-very-long-interface"}, "tunnel_iface"),
        ({"gateway_ip": None}, "gateway_ip"),
        ({"fwmark": 0}, "fwmark"),
        ({"fwmark": 0x1000, "fwmark_mask": 0xF00}, "fwmark"),
        ({"fwmark_mask": 0}, "fwmark_mask"),
        ({"remaps": [*REMAPS, Remap(N("10.97.0.0/16"), N("10.70.0.0/16"))]}, "remaps[3]"),
        ({"remaps": [*REMAPS, Remap(N("10.244.1.0/24"), N("10.72.1.0/24"))]}, "remaps[3]"),
    ],
)
def test_invalid_input_is_refused(kwargs: dict[str, object], field: str) -> None:
    arguments: dict[str, object] = {
        "table_name": "gpuferry_b",
        "tunnel_iface": "gf-b",
        "remaps": REMAPS,
        "snat_mode": SourceNatMode.GATEWAY,
        "gateway_ip": GATEWAY_IP,
    }
    arguments.update(kwargs)
    table_name = arguments.pop("table_name")
    with pytest.raises(NetworkConfigError) as info:
        render_nat_table(table_name, **arguments)  # type: ignore[arg-type]
    assert info.value.field == field


def test_render_delete_is_idempotent_text() -> None:
    assert render_delete("gpuferry_b") == "table ip gpuferry_b {}\ndelete table ip gpuferry_b\n"
    with pytest.raises(NetworkConfigError):
        render_delete("filter")


@pytest.mark.parametrize(
    ("cluster_id", "expected"),
    [
        ("b", "gpuferry_b"),
        ("provider1", "gpuferry_provider1"),
        ("Cluster-B.example", None),
        ("x" * 100, None),
        ("---", None),
    ],
)
def test_table_name_for_is_valid_and_stable(cluster_id: str, expected: str | None) -> None:
    name = table_name_for(cluster_id)
    assert name == table_name_for(cluster_id)
    assert name.startswith(TABLE_PREFIX)
    assert len(name) <= 64
    if expected is not None:
        assert name == expected
    render_delete(name)  # accepted by the renderer


def test_table_name_for_keeps_lookalike_ids_apart() -> None:
    assert table_name_for("a.b") != table_name_for("a-b")


# --- real nft, in a throwaway network namespace -------------------------------------------------

_CAN_NFT = bool(shutil.which("nft") and shutil.which("ip") and os.geteuid() == 0)


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"gf-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=True)


def nft(netns: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", netns, "nft", *args], capture_output=True, text=True, timeout=10
    )


@pytest.mark.nft
# CI installs nftables (hack/setup.sh) and runs as root: there the check must run, never skip
@pytest.mark.skipif(
    not _CAN_NFT and not os.environ.get("CI"), reason="needs root, nft and iproute2 (ip netns)"
)
@pytest.mark.parametrize("mode", list(SourceNatMode))
def test_nft_accepts_applies_reapplies_and_deletes(netns: str, tmp_path: Path, mode: SourceNatMode) -> None:
    script = tmp_path / "table.nft"
    script.write_text(render(mode))
    delete = tmp_path / "delete.nft"
    delete.write_text(render_delete("gpuferry_b"))

    checked = nft(netns, "-c", "-f", str(script))
    assert checked.returncode == 0, checked.stderr
    for _ in range(2):  # applying twice replaces, never duplicates
        applied = nft(netns, "-f", str(script))
        assert applied.returncode == 0, applied.stderr
    listed = nft(netns, "list", "table", "ip", "gpuferry_b").stdout
    assert listed.count("dnat prefix to 10.244.0.0/16") == 1
    assert listed.count("chain steer") == 1
    for _ in range(2):  # deleting twice is fine too
        deleted = nft(netns, "-f", str(delete))
        assert deleted.returncode == 0, deleted.stderr
    assert "gpuferry_b" not in nft(netns, "list", "tables").stdout
