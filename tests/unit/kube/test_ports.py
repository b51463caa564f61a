"""Free ports picked below the kernel's ephemeral range, never one that something is bound to."""

from __future__ import annotations

import errno
import random
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from kube.ports import free_port


def ephemeral_start() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


@pytest.fixture
def bound() -> Iterator[list[int]]:
    """Two loopback ports held bound for the test."""
    held = []
    for _ in range(2):
        sock = socket.socket()
        sock.bind(("127.0.0.1", free_port()))
        held.append(sock)
    yield [sock.getsockname()[1] for sock in held]
    for sock in held:
        sock.close()


def test_a_free_port_is_below_the_ephemeral_range_and_can_be_bound() -> None:
    port = free_port()
    assert 20000 <= port < ephemeral_start()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_a_bound_port_is_passed_over(bound: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    spare = free_port()
    monkeypatch.setattr(random, "sample", lambda population, k: [*bound, spare])
    assert free_port() == spare


def test_no_free_port_is_an_error_that_names_the_range(
    bound: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(random, "sample", lambda population, k: list(bound))
    with pytest.raises(OSError, match=rf"no free port on 127.0.0.1 in 20000-{ephemeral_start() - 1}"):
        free_port()


def test_an_address_not_of_this_machine_is_an_error_that_says_so() -> None:
    with pytest.raises(OSError, match=r"192\.0\.2\.1 is not an address of this machine") as raised:
        free_port("192.0.2.1")  # TEST-NET-1: never configured here
    assert raised.value.errno == errno.EADDRNOTAVAIL
