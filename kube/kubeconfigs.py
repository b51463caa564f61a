"""Where an API server is and how to authenticate to it, from a kubeconfig or in-cluster.

:func:`load_kubeconfig` reads the parts of a kubeconfig that gpuferry's clusters use: the
server, ``certificate-authority(-data)``, ``insecure-skip-tls-verify``, ``tls-server-name``,
``client-certificate(-data)``/``client-key(-data)``, ``token``/``tokenFile``, basic auth and
``exec`` credential plugins. :func:`in_cluster` reads the pod's service account. The result,
a :class:`Connection`, is turned into an ``ssl.SSLContext`` by :meth:`Connection.ssl_context`.
"""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from .times import unix_seconds

__all__ = [
    "SERVICE_ACCOUNT_DIR",
    "ConfigError",
    "Connection",
    "ExecPlugin",
    "in_cluster",
    "load_kubeconfig",
    "load_kubeconfig_data",
]

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

_TOKEN_FILE_TTL = 60.0  # projected service-account tokens are rotated well before they expire


class ConfigError(ValueError):
    """The kubeconfig (or the in-cluster environment) is missing or unusable."""


@dataclass(frozen=True)
class ExecPlugin:
    """A ``users[].user.exec`` credential plugin: run it to get an ``ExecCredential``."""

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    api_version: str = "client.authentication.k8s.io/v1"

    async def run(self) -> tuple[str | None, float | None, bytes | None, bytes | None]:
        """(token, expiry as a unix time, client certificate PEM, client key PEM)."""
        request = {"apiVersion": self.api_version, "kind": "ExecCredential", "spec": {"interactive": False}}
        env = {**os.environ, **dict(self.env), "KUBERNETES_EXEC_INFO": orjson.dumps(request).decode()}
        proc = await asyncio.create_subprocess_exec(
            self.command,
            *self.args,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        if proc.returncode != 0:
            detail = err.decode().strip()
            raise ConfigError(f"exec plugin {self.command} failed ({proc.returncode}): {detail}")
        status = orjson.loads(out).get("status") or {}
        expiry = None
        if status.get("expirationTimestamp"):
            expiry = unix_seconds(status["expirationTimestamp"])
        cert = status.get("clientCertificateData")
        key = status.get("clientKeyData")
        return status.get("token"), expiry, cert.encode() if cert else None, key.encode() if key else None


@dataclass
class Connection:
    """An API server endpoint and the credentials for it."""

    server: str
    ca_pem: bytes | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    client_cert_pem: bytes | None = None
    client_key_pem: bytes | None = None
    token: str | None = None
    token_file: Path | None = None
    basic_auth: tuple[str, str] | None = None
    exec_plugin: ExecPlugin | None = None
    _token_read_at: float = field(default=0.0, repr=False)
    _token_expiry: float | None = field(default=None, repr=False)

    async def prepare(self) -> None:
        """Run the exec plugin, if any, before the first request (it may provide client certs)."""
        if self.exec_plugin is not None and self.token is None and self.client_cert_pem is None:
            await self._run_exec()

    async def _run_exec(self) -> None:
        assert self.exec_plugin is not None
        token, expiry, cert, key = await self.exec_plugin.run()
        self.token, self._token_expiry = token, expiry
        if cert and key:
            self.client_cert_pem, self.client_key_pem = cert, key

    async def authorization(self) -> str | None:
        """The ``Authorization`` header value, refreshing file and exec tokens as they age."""
        if self.token_file is not None and time.monotonic() - self._token_read_at > _TOKEN_FILE_TTL:
            self.token = self.token_file.read_text().strip()
            self._token_read_at = time.monotonic()
        expiry = self._token_expiry
        if self.exec_plugin is not None and expiry is not None and time.time() > expiry - 10:
            await self._run_exec()
        if self.token:
            return f"Bearer {self.token}"
        if self.basic_auth:
            user, password = self.basic_auth
            return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        return None

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for an ``https`` server, ``None`` for plain ``http``."""
        if not self.server.startswith("https://"):
            return None
        ctx = ssl.create_default_context(cadata=self.ca_pem.decode() if self.ca_pem else None)
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.client_cert_pem and self.client_key_pem:
            # ssl only loads key pairs from files: write them to a private directory, briefly
            with tempfile.TemporaryDirectory(prefix="gpuferry-tls-") as tmp:
                cert_path, key_path = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
                for path, data in ((cert_path, self.client_cert_pem), (key_path, self.client_key_pem)):
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "wb") as f:
                        f.write(data)
                ctx.load_cert_chain(cert_path, key_path)
        return ctx


def _data_or_file(entry: dict[str, Any], key: str, base: Path) -> bytes | None:
    if entry.get(f"{key}-data"):
        return base64.b64decode(str(entry[f"{key}-data"]))
    if entry.get(key):
        return (base / os.path.expanduser(str(entry[key]))).read_bytes()
    return None


def _named(items: list[dict[str, Any]] | None, name: str, what: str, path: Path) -> dict[str, Any]:
    for item in items or []:
        if item.get("name") == name:
            return dict(item.get(what) or {})
    raise ConfigError(f"{path}: no {what} named {name!r}")


def load_kubeconfig(path: str | os.PathLike[str], context: str | None = None) -> Connection:
    """The connection of ``context`` (default: ``current-context``) in the kubeconfig at ``path``.

    Relative file references are resolved against the kubeconfig's directory, as kubectl does.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read kubeconfig {path}: {exc}") from exc
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a kubeconfig: not UTF-8 text (a binary file?)") from None
    return _connection(text, context, path)


def load_kubeconfig_data(
    data: str | bytes, context: str | None = None, *, source: str = "<data>"
) -> Connection:
    """The connection of ``context`` in a kubeconfig held in memory (e.g. a Secret's value).

    ``source`` names it in errors; file references are resolved against the current directory,
    so a kubeconfig kept in a Secret should embed its certificates (``*-data`` fields).
    """
    try:
        text = data.decode() if isinstance(data, bytes) else data
    except UnicodeDecodeError:
        raise ConfigError(f"{source} is not a kubeconfig: not UTF-8 text") from None
    return _connection(text, context, Path(source))


def _connection(text: str, context: str | None, path: Path) -> Connection:
    try:
        config = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:  # one line: the problem and where, not the parser's context lines
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path} is not a kubeconfig: YAML error{where}: {problem}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: not a kubeconfig")
    name = context or config.get("current-context")
    if not name:
        raise ConfigError(f"{path}: no context given and no current-context")
    ctx = _named(config.get("contexts"), name, "context", path)
    cluster = _named(config.get("clusters"), ctx.get("cluster", ""), "cluster", path)
    user = _named(config.get("users"), ctx["user"], "user", path) if ctx.get("user") else {}
    base = path.parent
    if not cluster.get("server"):
        raise ConfigError(f"{path}: cluster {ctx.get('cluster')!r} has no server")
    exec_plugin = None
    if user.get("exec"):
        spec = user["exec"]
        exec_plugin = ExecPlugin(
            command=spec["command"],
            args=tuple(spec.get("args") or ()),
            env=tuple((e["name"], e["value"]) for e in spec.get("env") or ()),
            api_version=spec.get("apiVersion", ExecPlugin.api_version),
        )
    token_file = Path(base, user["tokenFile"]) if user.get("tokenFile") else None
    basic = (user["username"], user.get("password", "")) if user.get("username") else None
    return Connection(
        server=str(cluster["server"]).rstrip("/"),
        ca_pem=_data_or_file(cluster, "certificate-authority", base),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        tls_server_name=cluster.get("tls-server-name"),
        client_cert_pem=_data_or_file(user, "client-certificate", base),
        client_key_pem=_data_or_file(user, "client-key", base),
        token=user.get("token"),
        token_file=token_file,
        basic_auth=basic,
        exec_plugin=exec_plugin,
    )


def in_cluster(environ: dict[str, str] | None = None, account_dir: Path = SERVICE_ACCOUNT_DIR) -> Connection:
    """The connection of a pod to its own cluster's API server, through its service account."""
    env = dict(os.environ) if environ is None else environ
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ConfigError("not in a cluster: KUBERNETES_SERVICE_HOST/PORT are not set")
    token_file = account_dir / "token"
    if not token_file.exists():
        raise ConfigError(f"not in a cluster: {token_file} does not exist")
    if ":" in host:
        host = f"[{host}]"  # IPv6
    return Connection(
        server=f"https://{host}:{port}", ca_pem=(account_dir / "ca.crt").read_bytes(), token_file=token_file
    )
