"""Settings shared by every component, as frozen dataclasses with one docstring per field.

Components take them as keyword-only arguments. The environment is read once, at an entry
point, with ``ClientSettings.from_env(prefix="GPUFERRY_")``: each field ``foo`` of a class whose
section is ``CLIENT`` is read from ``GPUFERRY_CLIENT_FOO``; unset variables keep the default.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

__all__ = [
    "ClientSettings",
    "LeaderElectionSettings",
    "LoggingSettings",
    "ProbeSettings",
    "QueueSettings",
    "WatchSettings",
    "cache_dir",
]

def cache_dir() -> Path:
    """``$GPUFERRY_CACHE``, else ``~/.cache/gpuferry``: the binaries built here (helm,
    wireguard-go), the local agents' state, what an install could not put back."""
    return Path(os.environ.get("GPUFERRY_CACHE") or Path.home() / ".cache" / "gpuferry")


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _convert(name: str, raw: str, hint: Any) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        if raw.strip().lower() in ("", "none", "null") and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(name, raw, inner)
    if origin is Literal:
        if raw not in args:
            raise ValueError(f"{name}={raw!r}: expected one of {', '.join(map(str, args))}")
        return raw
    if hint is bool:
        lowered = raw.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ValueError(f"{name}={raw!r}: expected a boolean (true/false)")
    if hint in (int, float):
        try:
            return hint(raw.strip())
        except ValueError:
            raise ValueError(f"{name}={raw!r}: expected {hint.__name__}") from None
    if hint is str:
        return raw
    raise TypeError(f"{name}: cannot read a {hint!r} from the environment")


class _FromEnv:
    section: ClassVar[str]

    @classmethod
    def env_names(cls, prefix: str = "GPUFERRY_") -> dict[str, str]:
        """Field name → environment variable name."""
        assert dataclasses.is_dataclass(cls)
        return {f.name: f"{prefix}{cls.section}_{f.name.upper()}" for f in dataclasses.fields(cls)}

    @classmethod
    def from_env(
        cls, prefix: str = "GPUFERRY_", environ: Mapping[str, str] | None = None, **overrides: Any
    ) -> Self:
        """Defaults, overridden by the environment, overridden by keyword arguments.

        Raises ``ValueError`` naming the variable when a value cannot be parsed.
        """
        env = os.environ if environ is None else environ
        hints = typing.get_type_hints(cls)
        values: dict[str, Any] = {}
        for field, var in cls.env_names(prefix).items():
            if var in env:
                values[field] = _convert(var, env[var], hints[field])
        values.update(overrides)
        return cls(**values)


@dataclass(frozen=True, kw_only=True)
class ClientSettings(_FromEnv):
    """How a :class:`kube.clients.KubeClient` talks to one API server."""

    section: ClassVar[str] = "CLIENT"

    qps: float = 500.0
    """Sustained requests per second allowed by the client-side rate limiter; <= 0 disables it.
    A safety net against a runaway loop, not the API server's protection (API Priority and
    Fairness is, and its 429s are honoured): at 100, a virtual kubelet offloading a burst of
    1000 pods (3 consumer requests each) waited 30 s on itself (issue 15). At 500 a burst of
    1000 pods goes as fast as with no limit at all (bench/offload.py)."""
    burst: int = 1000
    """Requests that may go out at once before the limiter starts spacing them at ``qps``."""
    request_timeout: float = 30.0
    """Seconds a non-streaming request may take in total."""
    connect_timeout: float = 10.0
    """Seconds to establish a connection (TCP and TLS), for every request and stream."""
    watch_timeout_seconds: int = 290
    """``timeoutSeconds`` asked of the server for a watch; it then ends the watch cleanly."""
    tcp_keepalive_seconds: float = 15.0
    """Seconds of silence before a connection is probed, and between probes (Go's default, which
    client-go uses); <= 0 leaves the system's (2 h on Linux). A stream to an API server that is
    gone without a word (``logs -f``, exec, a watch) then ends with an error after
    ``tcp_keepalive_seconds * (1 + tcp_keepalive_probes)`` instead of waiting for hours."""
    tcp_keepalive_probes: int = 4
    """Unanswered probes after which the kernel ends the connection."""
    max_connections: int = 100
    """Connections to the API server for ordinary (non-streaming) requests. Watches and log
    streams have connections of their own, without a limit: each holds one for as long as it
    runs, and a virtual kubelet watches several kinds in every namespace it has pods in, which
    would otherwise leave no connection for anything else."""
    user_agent: str = "gpuferry"
    """``User-Agent`` header, shown in API server audit logs and APF flow schemas."""
    throttle_retries: int = 3
    """Times a non-streaming request answered 429 (API priority and fairness, or "storage is
    (re)initializing" just after a CRD appears) is sent again after ``Retry-After`` (capped at
    ``throttle_max_wait``), as client-go does, before the error reaches the caller."""
    throttle_max_wait: float = 5.0


@dataclass(frozen=True, kw_only=True)
class QueueSettings(_FromEnv):
    """How a :class:`kube.queueing.KeyedQueue` retries and how many keys it works on at once."""

    section: ClassVar[str] = "QUEUE"

    workers: int = 16
    """Keys processed concurrently; one key is never processed by two workers at once."""
    backoff_base: float = 0.5
    """First retry delay of a failing key, doubled on every further failure."""
    backoff_max: float = 60.0
    """Cap of the per-key retry delay."""
    conflict_delay: float = 0.05
    """First retry delay after a 409 Conflict (read again and retry soon), doubled likewise."""
    drain_timeout: float = 30.0
    """Seconds ``shutdown`` lets work in progress finish before cancelling it."""


@dataclass(frozen=True, kw_only=True)
class WatchSettings(_FromEnv):
    """How :func:`kube.watching.watch_objects` lists, watches, resumes and relists."""

    section: ClassVar[str] = "WATCH"

    timeout_seconds: int = 290
    """``timeoutSeconds`` of each watch request; the watch is then resumed from the last rv."""
    page_size: int = 500
    """``limit`` of each LIST page; pages are followed with ``continue``."""
    read_timeout: float = 360.0
    """Seconds without a byte (events or bookmarks) after which a watch stream counts as dead."""
    backoff_base: float = 0.5
    """First delay before reconnecting after a 5xx, 429 or network error; doubled each time."""
    backoff_max: float = 30.0
    """Cap of the reconnect delay (a ``Retry-After`` from the server is honoured as sent)."""
    backoff_jitter: float = 0.2
    """Random fraction added to each reconnect delay, so many watchers do not reconnect at once."""
    relist_delay: float = 0.0
    """Seconds to wait before listing again after 410 Gone."""


@dataclass(frozen=True, kw_only=True)
class LoggingSettings(_FromEnv):
    """Where and how components log."""

    section: ClassVar[str] = "LOG"

    level: str = "INFO"
    """Root log level name (DEBUG, INFO, WARNING, ERROR)."""
    format: Literal["text", "json"] = "text"
    """``text`` for people, ``json`` for one JSON object per line."""
    quiet_libraries: bool = True
    """Raise aiohttp's and asyncio's loggers to WARNING."""


@dataclass(frozen=True, kw_only=True)
class ProbeSettings(_FromEnv):
    """Where a component serves ``/healthz``, ``/readyz`` and ``/metrics`` (:mod:`kube.probes`)."""

    section: ClassVar[str] = "PROBES"

    bind_address: str = "127.0.0.1"
    """Address to listen on: ``0.0.0.0`` in a pod (the kubelet probes the pod IP)."""
    port: int = 0
    """Port; 0 picks a free one (local processes), -1 serves nothing."""


@dataclass(frozen=True, kw_only=True)
class LeaderElectionSettings(_FromEnv):
    """The Lease that lets one replica of a component act at a time (:mod:`kube.leaderelection`)."""

    section: ClassVar[str] = "LEADER"

    enabled: bool = True
    namespace: str = "gpuferry-system"
    name: str = ""
    """The Lease's name; each component sets its own."""
    lease_seconds: int = 15
    """How long a Lease not renewed stays held: a standby takes over within this after the leader died."""
    renew_seconds: float = 5.0
    identity: str = ""
    """This replica's identity (default: host name, pid and a random suffix)."""
