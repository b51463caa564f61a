"""Markers for the netfabric unit tests."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "nft: checks rendered scripts with the real `nft` in a throwaway network namespace;"
        " runs only as root with nft and iproute2 installed, skipped (with the reason) otherwise",
    )
