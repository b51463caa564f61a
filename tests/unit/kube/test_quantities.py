from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from kube.quantities import (
    SharedLists,
    add,
    container_requests,
    covers,
    fits,
    format_quantity,
    format_resource_list,
    is_byte_resource,
    parse_quantity,
    parse_resource_list,
    pod_requests,
    sub,
    sum_requests,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("100m", Decimal("0.1")),
        ("1.5Gi", Decimal(1610612736)),
        ("2e3", Decimal(2000)),
        ("0.5", Decimal("0.5")),
        ("1E-3", Decimal("0.001")),
        ("1e+3", Decimal(1000)),
        ("1E", Decimal(10) ** 18),
        ("7Ei", Decimal(7 * 2**60)),
        ("128974848", Decimal(128974848)),
        ("129M", Decimal(129_000_000)),
        ("123Mi", Decimal(123 * 2**20)),
        ("1n", Decimal("1e-9")),
        ("250u", Decimal("0.00025")),
        ("1k", Decimal(1000)),
        ("1Ki", Decimal(1024)),
        (".5", Decimal("0.5")),
        ("5.", Decimal(5)),
        ("+2", Decimal(2)),
        ("-2Ki", Decimal(-2048)),
        ("0", Decimal(0)),
        (4, Decimal(4)),
        (Decimal("2.5"), Decimal("2.5")),
    ],
)
def test_parse_quantity(text: Any, expected: Decimal) -> None:
    assert parse_quantity(text) == expected


def test_parse_is_exact_beyond_float_precision() -> None:
    assert parse_quantity("8Ei") + parse_quantity("1n") == Decimal(8 * 2**60) + Decimal("1e-9")
    assert parse_quantity("0.1") + parse_quantity("0.2") == parse_quantity("300m")


@pytest.mark.parametrize(
    "text",
    ["", "1.5GB", "one", "1e", "1 ", " 1", "1\n", "--1", "1.2.3", "e3", "Gi", "1e1000", "1mi", "0x10", "1,5"],
)
def test_parse_invalid_raises_with_the_text(text: str) -> None:
    with pytest.raises(ValueError, match="invalid quantity") as info:
        parse_quantity(text)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize("value", [1.5, True, None])
def test_parse_refuses_non_quantities(value: Any) -> None:
    with pytest.raises(ValueError, match="invalid quantity"):
        parse_quantity(value)


@pytest.mark.parametrize(
    ("text", "like", "expected"),
    [
        ("4", "nvidia.com/gpu", "4"),
        ("2e3", "nvidia.com/gpu", "2000"),
        ("110", "pods", "110"),
        ("1500m", "cpu", "1500m"),
        ("1.5", "cpu", "1500m"),
        ("2000m", "cpu", "2"),
        ("100m", "cpu", "100m"),
        ("250u", "cpu", "250000n"),
        ("1.5Gi", "memory", "1536Mi"),
        ("16Gi", "memory", "16Gi"),
        ("1G", "memory", "1G"),
        ("2e3", "memory", "2k"),
        ("1023", "memory", "1023"),
        ("0", "memory", "0"),
        ("2Mi", "hugepages-2Mi", "2Mi"),
        ("100Gi", "ephemeral-storage", "100Gi"),
        ("-2Ki", "memory", "-2Ki"),
        ("0.5", "", "500m"),
    ],
)
def test_format_quantity(text: str, like: str, expected: str) -> None:
    assert format_quantity(parse_quantity(text), like=like) == expected


def test_format_rounds_up_below_nano_like_kubernetes() -> None:
    assert format_quantity(Decimal("0.0000000001"), like="cpu") == "1n"


def test_format_then_parse_round_trips() -> None:
    for text in ["1536Mi", "1500m", "4", "250000n", "1G", "7Ei"]:
        assert parse_quantity(format_quantity(parse_quantity(text), like="memory")) == parse_quantity(text)


def test_byte_resources() -> None:
    assert is_byte_resource("memory") and is_byte_resource("hugepages-1Gi")
    assert not is_byte_resource("cpu") and not is_byte_resource("nvidia.com/gpu")


def test_resource_list_parse_and_format() -> None:
    parsed = parse_resource_list({"cpu": "500m", "memory": "1.5Gi", "nvidia.com/gpu": 2})
    assert parsed == {"cpu": Decimal("0.5"), "memory": Decimal(1610612736), "nvidia.com/gpu": Decimal(2)}
    assert format_resource_list(parsed) == {"cpu": "500m", "memory": "1536Mi", "nvidia.com/gpu": "2"}
    assert parse_resource_list(None) == {}
    with pytest.raises(ValueError, match="resource memory: invalid quantity '1GB'"):
        parse_resource_list({"memory": "1GB"})


def test_add_sub_fits() -> None:
    a = {"cpu": Decimal(2), "nvidia.com/gpu": Decimal(1)}
    b = {"cpu": Decimal("0.5"), "memory": Decimal(1024)}
    assert add(a, b) == {"cpu": Decimal("2.5"), "nvidia.com/gpu": Decimal(1), "memory": Decimal(1024)}
    assert add() == {}
    assert sub(a, b) == {"cpu": Decimal("1.5"), "nvidia.com/gpu": Decimal(1), "memory": Decimal(-1024)}
    free = {"cpu": Decimal(4), "nvidia.com/gpu": Decimal(2)}
    request = {
        "cpu": Decimal(8),
        "nvidia.com/gpu": Decimal(2),
        "nvidia.com/mig-1g.10gb": Decimal(1),
        "memory": Decimal(0),
    }
    assert fits(request, free) == ["cpu", "nvidia.com/mig-1g.10gb"]
    assert fits({"nvidia.com/gpu": Decimal(2)}, free) == []
    # covers() is fits() finding nothing missing, for every case above
    assert not covers(free, request)
    assert covers(free, {"nvidia.com/gpu": Decimal(2), "memory": Decimal(0)})
    assert not covers(free, {"nvidia.com/mig-1g.10gb": Decimal(1)})  # absent from free: none free
    assert covers({}, {"cpu": Decimal(-1)})  # zero or negative requests always fit


def test_limits_only_extended_resources_count_as_requests() -> None:
    c = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "2"}, "requests": {"cpu": "1"}}}
    assert container_requests(c) == {"nvidia.com/gpu": Decimal(1), "cpu": Decimal(1)}


def _c(extra: dict[str, str] | None = None, **requests: str) -> dict[str, Any]:
    return {"name": "c", "resources": {"requests": {**requests, **(extra or {})}}}


def _pod(
    containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None, **spec: Any
) -> dict[str, Any]:
    return {"spec": {"containers": containers, "initContainers": init or [], **spec}}


def test_pod_requests_sum_of_containers() -> None:
    pod = _pod([_c(cpu="500m", memory="1Gi"), _c(cpu="1500m", memory="512Mi")])
    assert pod_requests(pod) == {"cpu": Decimal(2), "memory": Decimal(1536 * 2**20)}


def test_pod_requests_init_container_peak_wins() -> None:
    pod = _pod([_c(cpu="1", memory="1Gi")], init=[_c(cpu="4"), _c(memory="512Mi")])
    assert pod_requests(pod) == {"cpu": Decimal(4), "memory": Decimal(2**30)}


def test_pod_requests_sidecars_run_alongside() -> None:
    sidecar = {**_c(cpu="500m", memory="256Mi"), "restartPolicy": "Always"}
    # init-1 runs before the sidecar starts; init-2 runs next to it.
    pod = _pod([_c(cpu="1", memory="1Gi")], init=[_c(cpu="3"), sidecar, _c(cpu="2", memory="2Gi")])
    assert pod_requests(pod) == {"cpu": Decimal(3), "memory": Decimal(2 * 2**30 + 256 * 2**20)}
    # Without the big init containers: app + sidecar.
    assert pod_requests(_pod([_c(cpu="1", memory="1Gi")], init=[sidecar])) == {
        "cpu": Decimal("1.5"),
        "memory": Decimal(2**30 + 256 * 2**20),
    }


def test_pod_requests_overhead_and_pod_level_resources() -> None:
    pod = _pod(
        [_c({"nvidia.com/gpu": "1"}, cpu="1", memory="1Gi")],
        overhead={"cpu": "250m", "memory": "120Mi"},
        resources={"limits": {"cpu": "4"}, "requests": {"memory": "2Gi"}},
    )
    assert pod_requests(pod) == {
        "cpu": Decimal("4.25"),
        "memory": Decimal(2 * 2**30 + 120 * 2**20),
        "nvidia.com/gpu": Decimal(1),
    }


def test_pod_requests_of_an_empty_pod() -> None:
    assert pod_requests({}) == {}
    assert pod_requests(_pod([{"name": "c", "image": "x"}])) == {}


def test_sum_requests_counts_pod_slots() -> None:
    pods = [_pod([_c(cpu="1")]), _pod([_c({"nvidia.com/gpu": "2"})])]
    assert sum_requests(pods) == {"cpu": Decimal(1), "nvidia.com/gpu": Decimal(2), "pods": Decimal(2)}
    assert sum_requests([]) == {}


def test_equal_resource_lists_are_handed_out_as_one() -> None:
    shared = SharedLists(limit=2)
    first = shared({"cpu": Decimal("0.5"), "nvidia.com/gpu": Decimal(1)})
    again = shared({"nvidia.com/gpu": Decimal(1), "cpu": Decimal("0.5")})
    assert again is first
    other = shared({"cpu": Decimal(1)})
    assert other is not first and other == {"cpu": Decimal(1)}
    third = shared({"cpu": Decimal(2)})  # past the limit: it starts over
    assert shared({"cpu": Decimal("0.5"), "nvidia.com/gpu": Decimal(1)}) is not first
    assert shared({"cpu": Decimal(2)}) is third
