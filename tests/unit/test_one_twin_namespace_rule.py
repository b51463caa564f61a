"""The virtual kubelet and the provider name a twin namespace by one rule (issue 14: for a
62-character namespace they once gave two different names)."""

from __future__ import annotations

import pytest

from kube.api import is_dns1123_label
from peering.resources import twin_namespace_name
from vk.forge.names import twin_namespace


@pytest.mark.parametrize("length", [1, 30, 52, 53, 56, 60, 61, 62, 63])
@pytest.mark.parametrize("consumer", ["c", "ml-eu", "a-consumer-id-of-forty-characters-abcdef", "x" * 63])
def test_the_virtual_kubelet_and_the_provider_agree(length: int, consumer: str) -> None:
    origin = ("ns-" + "a" * 70)[:length].rstrip("-") or "n"
    vk_name = twin_namespace(origin, consumer)
    assert vk_name == twin_namespace_name(origin, consumer)
    assert is_dns1123_label(vk_name)
    same = twin_namespace(origin, consumer, strategy="same")
    assert same == twin_namespace_name(origin, consumer, "SameName") == origin
