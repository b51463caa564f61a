"""Sysctls of a gateway's own network namespace: only what differs is written, and where
/proc/sys is read-only (a container) a wrong value is one error naming what to set."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from netfabric import nsexec


@pytest.fixture
def proc_sys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "sys"
    (root / "net" / "ipv4" / "conf" / "all").mkdir(parents=True)
    (root / "net" / "ipv4" / "ip_forward").write_text("0\n")
    (root / "net" / "ipv4" / "conf" / "all" / "rp_filter").write_text("0\n")
    monkeypatch.setattr(nsexec, "PROC_SYS", root)
    return root


async def test_values_already_right_are_not_written(proc_sys: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("nothing should be written")

    (proc_sys / "net" / "ipv4" / "ip_forward").write_text("1\n")
    monkeypatch.setattr(Path, "write_text", refuse)
    assert await nsexec.ensure_sysctls({"net.ipv4.ip_forward": "1", "net.ipv4.conf.all.rp_filter": "0"}) == {}


async def test_a_wrong_value_is_written_and_reported(proc_sys: Path) -> None:
    changed = await nsexec.ensure_sysctls({"net.ipv4.ip_forward": "1", "net.ipv4.conf.all.rp_filter": "0"})
    assert changed == {"net.ipv4.ip_forward": "0"}
    assert (proc_sys / "net" / "ipv4" / "ip_forward").read_text().strip() == "1"


async def test_read_only_proc_sys_names_the_sysctl_and_where_to_set_it(
    proc_sys: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def read_only(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(Path, "write_text", read_only)
    with pytest.raises(nsexec.SysctlReadOnly) as caught:
        await nsexec.ensure_sysctls({"net.ipv4.ip_forward": "1"})
    message = str(caught.value)
    assert "net.ipv4.ip_forward is 0, needs 1" in message
    assert "securityContext.sysctls" in message and "--allowed-unsafe-sysctls" in message
