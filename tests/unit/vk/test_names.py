from __future__ import annotations

import pytest

from vk.forge.names import is_dns1123_label, is_dns1123_subdomain, node_name, twin_namespace

UUID = "0f3c2a91-1b2c-4d5e-8f90-123456789abc"


def test_default_twin_namespace() -> None:
    assert twin_namespace("ml-team", "c7d2a9e4") == "ml-team-c7d2a9e4"
    assert twin_namespace("default", UUID) == f"default-{UUID}"


def test_same_strategy_keeps_the_name() -> None:
    assert twin_namespace("ml-team", "c7d2a9e4", strategy="same") == "ml-team"


def test_exactly_63_characters_is_kept_whole() -> None:
    namespace = "n" * (63 - len(UUID) - 1)
    assert twin_namespace(namespace, UUID) == f"{namespace}-{UUID}"


def test_long_names_are_shortened_keep_the_consumer_id_and_stay_valid() -> None:
    namespace = "research-computer-vision-" + "x" * 38
    twin = twin_namespace(namespace, UUID)
    assert len(twin) == 63
    assert is_dns1123_label(twin)
    assert twin.endswith(f"-{UUID}")
    assert twin.startswith("research-comp")
    assert twin == twin_namespace(namespace, UUID), "stable"


def test_long_names_sharing_a_prefix_never_collide() -> None:
    base = "team-alpha-distributed-training-experiments-"
    names = {twin_namespace(f"{base}{suffix}", UUID) for suffix in ("a", "b", "run-1", "run-2", "z" * 18)}
    assert len(names) == 5
    assert all(len(n) <= 63 and is_dns1123_label(n) for n in names)


def test_same_namespace_different_consumers_differ() -> None:
    namespace = "n" * 60
    assert twin_namespace(namespace, UUID) != twin_namespace(namespace, UUID.replace("0f3c", "0f3d"))


def test_shortened_prefix_never_ends_with_a_dash() -> None:
    # The cut falls right after a '-': it is removed, not left doubled before the hash.
    namespace = "a" * 16 + "-" + "b" * 40
    twin = twin_namespace(namespace, UUID)
    assert "--" not in twin and is_dns1123_label(twin)


def test_very_long_consumer_id_still_gives_a_valid_label() -> None:
    consumer = "c" * 60
    twin = twin_namespace("ml-team", consumer)
    assert len(twin) == 63 and is_dns1123_label(twin)
    assert twin != twin_namespace("ml-teams", consumer)


@pytest.mark.parametrize(
    ("namespace", "consumer"),
    [("ML", "c1"), ("ml_team", "c1"), ("ml", "C1"), ("ml", ""), ("", "c1"), ("-ml", "c1")],
)
def test_invalid_inputs_raise(namespace: str, consumer: str) -> None:
    with pytest.raises(ValueError, match="DNS-1123"):
        twin_namespace(namespace, consumer)


def test_unknown_strategy_raises() -> None:
    with pytest.raises(ValueError, match="strategy"):
        twin_namespace("ml", "c1", strategy="mirror")  # type: ignore[arg-type]


def test_node_name() -> None:
    assert node_name("p3f81b06") == "gpuferry-p3f81b06"
    assert node_name(UUID) == f"gpuferry-{UUID}"
    assert is_dns1123_subdomain(node_name("eu-west.gpu-pool"))
    for bad in ("", "Prov", "p_1", "p" * 60, "p."):
        with pytest.raises(ValueError, match="node name"):
            node_name(bad)
