"""Fixtures for kube/ unit tests: the fake API server and a client pointed at it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import orjson
import pytest
from aiohttp.test_utils import TestServer

from kube.clients import KubeClient
from kube.settings import ClientSettings

from .fakeapi import FakeApi

TOKEN = "s3cr3t-token"


def write_kubeconfig(
    path: Path,
    server: str,
    *,
    user: Mapping[str, object] | None = None,
    cluster: Mapping[str, object] | None = None,
) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server, **(cluster or {})}}],
        "users": [{"name": "me", "user": dict(user) if user is not None else {"token": TOKEN}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me"}}],
        "current-context": "fake",
    }
    path.write_bytes(orjson.dumps(config))
    return path


@pytest.fixture
def fake() -> FakeApi:
    return FakeApi()


@pytest.fixture
async def server(fake: FakeApi) -> AsyncIterator[TestServer]:
    srv = TestServer(fake.app, host="127.0.0.1")
    await srv.start_server()
    yield srv
    await srv.close()


@pytest.fixture
def kubeconfig(server: TestServer, tmp_path: Path) -> Path:
    return write_kubeconfig(tmp_path / "kubeconfig", str(server.make_url("")).rstrip("/"))


@pytest.fixture
async def client(kubeconfig: Path) -> AsyncIterator[KubeClient]:
    settings = ClientSettings(qps=0, request_timeout=5)
    async with KubeClient.from_kubeconfig(kubeconfig, settings=settings) as c:
        yield c
