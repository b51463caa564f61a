"""The virtual node's kubelet API: an aiohttp app over TLS on ``node_address:kubelet_port``.

Routes follow the kubelet's paths (pkg/kubelet/server/server.go); each is answered from the
consumer pod bound to this node and its twin on the provider:

- ``/containerLogs/{ns}/{pod}/{container}``: the twin's ``pods/log`` streamed back, with
  follow, tailLines (and the legacy ``tail``), sinceSeconds, sinceTime, timestamps, previous and
  limitBytes passed through; a follow cut short goes on where it was (:mod:`.logresume`);
- ``/exec``, ``/attach`` (with or without the pod UID) and ``/portForward``: WebSocket streams
  relayed to the twin's ``pods/exec|attach|portforward`` (:mod:`.streams`), SPDY/3.1 upgrades
  passed through to the same (:mod:`.spdy`);
- ``/pods``, ``/runningpods/``: the consumer pods bound here (running ones: twin Running);
- ``/stats/summary``, ``/metrics/resource``, ``/metrics/cadvisor``: node and pod identity and
  start times, and CPU and memory where the provider's metrics API measured a twin
  (:mod:`vk.forge.usage`; absent, never made up, where it did not);
- ``/metrics``: the virtual kubelet's own metrics, as a kubelet serves its own there, with
  ``kubelet_node_name``, ``kubelet_running_pods`` and ``kubelet_running_containers``;
  ``/metrics/probes``: no series, for the twins' probes run on the provider's kubelet (a
  Prometheus that scrapes every kubelet's three paths finds each one up);
- ``/healthz``: ok.

Anything else is a 404 from the router. Every request is authenticated and authorised first
(:mod:`.auth`).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable
from dataclasses import dataclass

import orjson
from aiohttp import web

from kube.clients import KubeClient
from kube.errors import KubeError, is_temporary
from kube.informers import Stored
from kube.metrics import render
from kube.objects import ObjectKey, RawObject, Resource

from ..forge.kubeletmetrics import kubelet_metrics, pod_states
from ..forge.usage import (
    CpuCounters,
    Measured,
    PodRef,
    PodTexts,
    cadvisor_metrics,
    cadvisor_texts,
    measure,
    resource_metrics,
    resource_texts,
    stats_summary,
    summary_texts,
    twin_usage,
)
from .auth import Authenticator, auth_middleware
from .certificates import CertificateError, ServingCertificate
from .logresume import LogCursor, resumable, resume_params
from .nodepods import FollowedStore, NodePodIndex, NodePods
from .spdy import is_spdy, passthrough
from .streams import EXEC_PROTOCOLS, PORTFORWARD_PROTOCOLS, provider_stream_query, relay

logger = logging.getLogger(__name__)

RESUME_FIRST_PAUSE = 0.25
RESUME_MAX_PAUSE = 4.0
RESUME_LAST_ANSWER = 1.0
"""Seconds a reopening of a followed log may wait for the provider's answer at least, even at
the end of the window: one made there still finds a provider just back."""
LOG_PARAMS = ("follow", "tailLines", "sinceSeconds", "sinceTime", "timestamps", "previous", "limitBytes")

PodLookup = Callable[[ObjectKey], RawObject | None]
IdentityLookup = Callable[[ObjectKey], Stored | None]


@dataclass(frozen=True)
class KubeletContext:
    """What the routes need: the provider client, and the pod caches of both sides."""

    node_name: str
    provider: KubeClient
    local_pod: PodLookup
    """The consumer pod bound to this node, by key (None: not here)."""
    twin_pod: PodLookup
    """Its twin on the provider, by the consumer pod's key (None: not created yet)."""
    local_keys: Callable[[], list[ObjectKey]]
    local_identity: IdentityLookup
    """A consumer pod's UID, resourceVersion and key, by its key, without decoding it."""
    twin_identity: IdentityLookup
    """Its twin's, by the consumer pod's key: the twin's own key among them."""
    started: datetime.datetime
    own_metrics: Callable[[], bytes] = render
    """The virtual kubelet's own metrics in Prometheus' text format."""
    log_resume_seconds: float = 30.0
    """How long a followed log cut short by the provider is tried again (:mod:`.logresume`)
    before it ends, waits for the provider's answers included (at most ``RESUME_LAST_ANSWER``
    later)."""
    followed: tuple[FollowedStore, ...] = ()
    """The stores that tell where they changed (the consumer pods', the twins'): a scrape reads
    again only the pods that changed since the last one (none: every pod, every scrape)."""


CONTEXT = web.AppKey("kubelet_context", KubeletContext)


def _status(code: int, reason: str, message: str) -> web.Response:
    return web.json_response(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        },
        status=code,
    )


Answer = Callable[[int, str, str], web.Response]
"""How a route answers an error: (code, reason, message)."""


def _text(code: int, _reason: str, message: str) -> web.Response:
    """An error of a plain GET (logs) as the kubelet writes one (go-restful's WriteError): its
    message as text. The API server gives a 400's or a 500's text to the client as the message
    (kubectl: ``Error from server (BadRequest): …``); a Status in JSON was shown raw."""
    return web.Response(status=code, text=message, content_type="text/plain")


def _twin(
    request: web.Request, answer: Answer = _status, *, waiting_code: int = 404
) -> tuple[RawObject, RawObject] | web.Response:
    """The consumer pod named by the path and its twin, or the error answer."""
    ctx = request.app[CONTEXT]
    ns, name = request.match_info["namespace"], request.match_info["pod"]
    key = ObjectKey(ns, name)
    pod = ctx.local_pod(key)
    if pod is None:
        return answer(404, "NotFound", f"pod {ns}/{name} is not on node {ctx.node_name}")
    uid = request.match_info.get("uid")
    if uid and pod["metadata"].get("uid") != uid:
        return answer(404, "NotFound", f"pod {ns}/{name} with UID {uid} is not on node {ctx.node_name}")
    twin = ctx.twin_pod(key)
    if twin is None:
        container = request.match_info.get("container") or request.rel_url.query.get("container")
        return answer(waiting_code, "NotFound", waiting_to_start(pod, container))
    return pod, twin


def waiting_to_start(pod: RawObject, container: str | None) -> str:
    """What a pod with no twin yet is waiting for, in the kubelet's words for a container not
    started (``container "c" in pod "p" is waiting to start: …``), followed by the reason and
    message the virtual kubelet holds the pod Pending with, when it holds it (no provider node
    with room, the namespace not offloaded, a mount not ready): the user asking for its logs
    learns why there are none. A pod that ended so (refused by the provider) is ``terminated``,
    as the kubelet says of a container that ended without leaving a log. Pure."""
    name = pod["metadata"]["name"]
    who = f'container "{container}" in pod "{name}"' if container else f'pod "{name}"'
    status = pod.get("status") or {}
    reason, message = status.get("reason"), status.get("message")
    why = f": {reason}: {message}" if reason and message else ""
    if status.get("phase") in ("Succeeded", "Failed"):
        # ended without a twin (refused by the provider, its twin deleted behind our back): not
        # waiting for anything any more
        return f"{who} is terminated{why}"
    return f"{who} is waiting to start{why or ': its twin on the provider is not created yet'}"


def _twin_path(twin: RawObject, sub: str) -> str:
    meta = twin["metadata"]
    return f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/{sub}"


async def container_logs(request: web.Request) -> web.StreamResponse:
    # 400, as the kubelet answers for a container not started: the API server keeps its text
    found = _twin(request, _text, waiting_code=400)
    if isinstance(found, web.Response):
        return found
    _, twin = found
    ctx = request.app[CONTEXT]
    query = request.rel_url.query
    params: dict[str, str] = {"container": request.match_info["container"]}
    for name in LOG_PARAMS:
        if name in query:
            params[name] = query[name]
    tail = query.get("tail")
    if tail is not None and tail != "all" and "tailLines" not in params:
        params["tailLines"] = tail
    path = _twin_path(twin, "log")
    resume = resumable(params)
    cursor = LogCursor(keep_timestamps=params.get("timestamps") in ("true", "1"))
    if resume:
        params["timestamps"] = "true"  # where a reopened stream is to go on from
    response: web.StreamResponse | None = None
    loop = asyncio.get_running_loop()
    cut_at: float | None = None  # loop time of the cut being followed across
    pause = RESUME_FIRST_PAUSE
    while True:
        # once cut, trying again is bounded by the window, waits for answers included: a provider
        # that takes the connection and never answers (or drops its packets until the connect
        # timeout) ends the follow when the window ends, not later or never
        bound = None
        if cut_at is not None:
            bound = max(cut_at + ctx.log_resume_seconds, loop.time() + RESUME_LAST_ANSWER)
        try:
            async with (
                asyncio.timeout_at(bound) as opening,
                ctx.provider.stream("GET", path, params) as upstream,
            ):
                opening.reschedule(None)  # open: the stream itself runs as long as the container
                if response is None:
                    response = web.StreamResponse(headers={"Content-Type": "text/plain"})
                    response.enable_chunked_encoding()
                    await response.prepare(request)
                elif cut_at is not None:
                    logger.info("logs of pod %s/%s followed again after %.1fs",
                                request.match_info["namespace"], request.match_info["pod"],
                                loop.time() - cut_at)  # fmt: skip
                cut_at, pause = None, RESUME_FIRST_PAUSE
                async for chunk in upstream.content.iter_any():
                    await response.write(cursor.feed(chunk) if resume else chunk)
            if resume:
                await response.write(cursor.end())
            await response.write_eof()
            return response
        except TimeoutError:
            # only a reopening bounded by the window times out here (the client's own timeouts
            # come as KubeError)
            assert response is not None and cut_at is not None
            return _cut_for_good(
                request, response, f"no answer in the {ctx.log_resume_seconds:g}s it is tried again"
            )
        except KubeError as exc:
            if response is None or not response.prepared:
                # the provider's own words, e.g. 'container "main" in pod "ns/x" is waiting to
                # start'; any 4xx as 400 and anything else as 500, the two the API server
                # passes on with the text
                code = 400 if exc.status and 400 <= exc.status < 500 else 500
                return _text(code, exc.reason or "ProviderError", f"provider: {exc.message}")
            now = loop.time()
            cut_at = now if cut_at is None else cut_at
            left = cut_at + ctx.log_resume_seconds - now
            if not (resume and is_temporary(exc) and left > 0):
                return _cut_for_good(request, response, exc)
            # cut short while following (the provider restarted, the connection dropped): go
            # on where it was, rather than end as if the container had
            if pause == RESUME_FIRST_PAUSE:
                logger.info("logs of pod %s/%s cut short by the provider (%s): following again",
                            request.match_info["namespace"], request.match_info["pod"], exc)  # fmt: skip
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, RESUME_MAX_PAUSE)
            if cursor.last is not None:  # else nothing was passed on: the same request again
                params = resume_params(params, cursor.last)
            cursor.reopened()


def _cut_for_good(request: web.Request, response: web.StreamResponse, why: object) -> web.StreamResponse:
    """End a log stream the provider cut short, as cut. The status is sent, so no error answer
    can follow: without its last chunk the body reads as cut, not ended (answering a second
    time left the client waiting for the rest, ``kubectl logs -f`` forever)."""
    logger.warning("logs of pod %s/%s cut short by the provider: %s",
                   request.match_info["namespace"], request.match_info["pod"], why)  # fmt: skip
    if request.transport is not None:
        request.transport.close()
    return response


async def exec_(request: web.Request) -> web.StreamResponse:
    return await _stream(request, "exec")


async def attach(request: web.Request) -> web.StreamResponse:
    return await _stream(request, "attach")


async def port_forward(request: web.Request) -> web.StreamResponse:
    return await _stream(request, "portforward")


async def _stream(request: web.Request, kind: str) -> web.StreamResponse:
    found = _twin(request)
    if isinstance(found, web.Response):
        return found
    _, twin = found
    container = request.match_info.get("container")
    query = provider_stream_query(kind, request.rel_url.query, container)
    if is_spdy(request):
        provider = request.app[CONTEXT].provider
        return await passthrough(request, provider, path=_twin_path(twin, kind), query=query)
    protocols = PORTFORWARD_PROTOCOLS if kind == "portforward" else EXEC_PROTOCOLS
    return await relay(
        request,
        request.app[CONTEXT].provider,
        path=_twin_path(twin, kind),
        query=query,
        supported=protocols,
        ends_with_status=kind != "portforward",
    )


def _pod_list(pods: list[RawObject]) -> RawObject:
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": pods}


def _local_pods(ctx: KubeletContext) -> list[RawObject]:
    return [pod for key in ctx.local_keys() if (pod := ctx.local_pod(key)) is not None]


async def pods(request: web.Request) -> web.Response:
    return web.json_response(_pod_list(_local_pods(request.app[CONTEXT])))


async def running_pods(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    running = []
    for pod in _local_pods(ctx):
        key = ObjectKey(pod["metadata"].get("namespace"), pod["metadata"]["name"])
        twin = ctx.twin_pod(key)
        if twin is not None and (twin.get("status") or {}).get("phase") == "Running":
            running.append(pod)
    return web.json_response(_pod_list(running))


async def healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


PODMETRICS = Resource("metrics.k8s.io", "v1beta1", "pods", "PodMetrics", namespaced=True)
USAGE_READ_SECONDS = 5.0
"""How long a scrape waits for the provider's metrics: metrics-server gives a kubelet 10 s, and a
provider slow or away should cost the node its usage figures, not the whole scrape."""


class Usage:
    """What the usage routes keep between scrapes: the node's pods (read again where they
    changed), the CPU counters, each path's texts of the pods (made again only for a pod that
    changed), and the last failure to read the provider's metrics (logged when it changes, not
    at every scrape)."""

    def __init__(self, timeout: float = USAGE_READ_SECONDS) -> None:
        self.counters = CpuCounters()
        self.resource_texts = PodTexts(resource_texts)
        self.cadvisor_texts = PodTexts(cadvisor_texts)
        self.pod_states = PodTexts(pod_states)
        self.summary_texts = PodTexts(summary_texts)
        self.failed: str | None = None
        self.timeout = timeout
        self._pods = NodePodIndex()

    def pods(self, ctx: KubeletContext) -> NodePods:
        """The pods bound here and their twins, of which only those that changed since the last
        scrape are read again (:class:`~.nodepods.NodePodIndex`)."""
        return self._pods.read(ctx)

    async def read(self, ctx: KubeletContext, pods: NodePods) -> tuple[list[Measured], Measured | None]:
        """The usage of the containers of ``pods`` that the provider's metrics API gives for
        their twins (one list per twin namespace), and the node's; sets :attr:`failed`. Neither
        a pod nor its twin is decoded but for a container's first sample."""
        twins = pods.twins

        async def metrics_of(namespace: str) -> RawObject:
            async with asyncio.timeout(self.timeout):
                return await ctx.provider.list(PODMETRICS, namespace)

        listed = await asyncio.gather(*(metrics_of(ns) for ns in twins), return_exceptions=True)
        answered: dict[str, RawObject] = {}
        failures = []
        for ns, result in zip(twins, listed, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                failures.append(f"{ns}: {result or type(result).__name__}")
            else:
                answered[ns] = result
        usage, unreadable = twin_usage(twins, answered)
        failures += unreadable
        failed = "; ".join(failures) or None
        if failed != self.failed:
            if failed:
                logger.warning("usage of the pods on %s not read from the provider: %s",
                               ctx.node_name, failed)  # fmt: skip
            elif self.failed:
                logger.info("usage of the pods on %s read from the provider again", ctx.node_name)
            self.failed = failed
        return measure(pods.refs, usage, self.counters)


USAGE = web.AppKey("kubelet_usage", Usage)


async def summary(request: web.Request) -> web.Response:
    """The Summary API's shape: identities and start times, and CPU and memory where the
    provider's metrics API measured the twin (:func:`vk.forge.usage.stats_summary`)."""
    ctx, usage = request.app[CONTEXT], request.app[USAGE]
    local = usage.pods(ctx)
    measured, node = await usage.read(ctx, local)
    found = stats_summary(ctx.node_name, ctx.started, local.refs, measured, node, usage.summary_texts)
    return web.Response(body=orjson.dumps(found), content_type="application/json")


async def _measured(
    request: web.Request,
) -> tuple[tuple[PodRef, ...], list[Measured], Measured | None, bool]:
    """The pods bound here, their containers' usage and the node's, and whether reading the
    provider failed."""
    ctx, usage = request.app[CONTEXT], request.app[USAGE]
    local = usage.pods(ctx)
    measured, node = await usage.read(ctx, local)
    return local.refs, measured, node, usage.failed is not None


async def metrics_resource(request: web.Request) -> web.Response:
    """The resource metrics endpoint that metrics-server scrapes (``kubectl top``): container
    start times, and the usage the provider's metrics API measured for the twins."""
    local, measured, node, failed = await _measured(request)
    texts = request.app[USAGE].resource_texts
    return web.Response(text=resource_metrics(local, measured, node, scrape_error=failed, texts=texts),
                        content_type="text/plain", charset="utf-8")  # fmt: skip


async def metrics_cadvisor(request: web.Request) -> web.Response:
    """The cAdvisor endpoint that Prometheus scrapes on every node: the same usage as
    ``/metrics/resource``, under cAdvisor's names and labels."""
    local, measured, _, failed = await _measured(request)
    texts = request.app[USAGE].cadvisor_texts
    return web.Response(text=cadvisor_metrics(local, measured, scrape_error=failed, texts=texts),
                        content_type="text/plain", charset="utf-8")  # fmt: skip


async def own_metrics(request: web.Request) -> web.Response:
    """The virtual kubelet's own metrics, and the kubelet's few that dashboards count kubelets and
    their pods by (:mod:`vk.forge.kubeletmetrics`)."""
    ctx, usage = request.app[CONTEXT], request.app[USAGE]
    body = ctx.own_metrics() + kubelet_metrics(ctx.node_name, usage.pods(ctx).refs, usage.pod_states).encode()
    return web.Response(body=body, content_type="text/plain", charset="utf-8")


PROBE_METRICS = (
    "# HELP prober_probe_total [BETA] Cumulative number of a liveness, readiness or startup probe for a "
    "container by result.\n"
    "# TYPE prober_probe_total counter\n"
)
"""``/metrics/probes``: the family with no series. The twins' probes run on the provider's
kubelet, which counts them; this one runs none."""


async def probe_metrics(_: web.Request) -> web.Response:
    return web.Response(text=PROBE_METRICS, content_type="text/plain", charset="utf-8")


def make_app(ctx: KubeletContext, authn: Authenticator) -> web.Application:
    app = web.Application(middlewares=[auth_middleware(authn)])
    app[CONTEXT] = ctx
    app[USAGE] = Usage()
    r = app.router
    r.add_get("/healthz", healthz)
    r.add_get("/pods", pods)
    r.add_get("/pods/", pods)
    r.add_get("/runningpods/", running_pods)
    r.add_get("/stats/summary", summary)
    r.add_get("/metrics/resource", metrics_resource)
    r.add_get("/metrics/cadvisor", metrics_cadvisor)
    r.add_get("/metrics/probes", probe_metrics)
    r.add_get("/metrics", own_metrics)
    r.add_get("/containerLogs/{namespace}/{pod}/{container}", container_logs)
    for method in ("GET", "POST"):
        r.add_route(method, "/exec/{namespace}/{pod}/{container}", exec_)
        r.add_route(method, "/exec/{namespace}/{pod}/{uid}/{container}", exec_)
        r.add_route(method, "/attach/{namespace}/{pod}/{container}", attach)
        r.add_route(method, "/attach/{namespace}/{pod}/{uid}/{container}", attach)
        r.add_route(method, "/portForward/{namespace}/{pod}", port_forward)
        r.add_route(method, "/portForward/{namespace}/{pod}/{uid}", port_forward)
    return app


async def serve_kubelet_api(
    *,
    consumer: KubeClient,
    ctx: KubeletContext,
    certificate: ServingCertificate,
    host: str,
    port: int,
    ready: asyncio.Event | None = None,
    retry_seconds: float = 30.0,
) -> None:
    """Obtain the serving certificate, serve until cancelled, renew the certificate meanwhile.

    Until a certificate is issued (e.g. nobody has approved the CSR yet) nothing listens and
    the attempt is repeated every ``retry_seconds``: the rest of the virtual kubelet (pods,
    node) goes on meanwhile.
    """
    while True:
        try:
            await certificate.setup()
            break
        except (CertificateError, KubeError) as exc:
            logger.warning(
                "kubelet API of %s not served yet: %s; retrying in %.0fs", ctx.node_name, exc, retry_seconds
            )
            await asyncio.sleep(retry_seconds)
    app = make_app(ctx, Authenticator(consumer, ctx.node_name))
    # handler_cancellation: a client that goes away (kubectl logs -f interrupted) cancels its
    # handler, which closes the provider stream it was relaying, instead of leaking it
    runner = web.AppRunner(app, handle_signals=False, handler_cancellation=True, shutdown_timeout=5.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, ssl_context=certificate.context).start()
        logger.info("kubelet API of %s on https://%s:%d", ctx.node_name, host, port)
        if ready is not None:
            ready.set()
        await certificate.keep_renewed()
    finally:
        await asyncio.shield(runner.cleanup())
