"""``/metrics`` of ``geograph serve``: Prometheus counters and histograms through LitServe's loggers.

Events are put on LitServe's logger queue (``LitAPI.log``): the API servers log every
finished HTTP request (:class:`RequestMetricsMiddleware`: endpoint, status, seconds), the
inference workers each endpoint's part of every batch (endpoint, size). LitServe's logger
process hands them to :class:`PrometheusLogger`, which updates prometheus-client metrics in
multiprocess mode (``$PROMETHEUS_MULTIPROC_DIR``, a private temporary folder unless set);
``/metrics`` in every API server reads that folder. Exported:

* ``geograph_requests_total{endpoint, status}`` (counter)
* ``geograph_request_errors_total{endpoint, status}`` (counter, status >= 400)
* ``geograph_request_latency_seconds{endpoint}`` (histogram)
* ``geograph_batch_size{endpoint}`` (histogram)
* ``geograph_stage_seconds{endpoint, stage}`` (histogram): where a request's time in an inference
  worker goes, one observation per request and stage: ``queue`` (from its arrival to its batch's
  start), ``tokenise`` and ``encode`` (its batch's tokenizing and encoding of request texts, which
  every request of the batch waits for), ``method`` (the batch's module call) and ``serialise``
  (unpacking the results into answers); ``endpoint`` is ``/retrieve`` or ``/rerank`` (the interop
  routes join ``/rerank``)

``endpoint`` is the path for the server's own routes and ``other`` for any other path (so an
unknown URL cannot grow the label set). Metrics trail the responses by the logger queue's
latency (milliseconds).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from geograph.serve._litserve import logging_enabled
from geograph.serve.lifecycle import ParentGuard

if TYPE_CHECKING:
    import ctypes

    from fastapi import FastAPI
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

try:
    import litserve as ls
except ImportError:  # pragma: no cover - exercised only without the serve extra
    ls = None  # only without the serve extra

ROUTES = ("/retrieve", "/rerank", "/v1/rerank", "/v2/rerank", "/health", "/metrics")
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
STAGE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


def endpoint_label(path: str) -> str:
    """The ``endpoint`` label of a request path.

    Example:
        >>> endpoint_label("/rerank"), endpoint_label("/no/such/path")
        ('/rerank', 'other')
    """
    return path if path in ROUTES else "other"


def metrics_text() -> tuple[bytes, str]:
    """``(body, content type)`` of the multiprocess registry in Prometheus text format."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]  # unannotated in prometheus_client
    return generate_latest(registry), CONTENT_TYPE_LATEST


def add_metrics_route(app: FastAPI) -> None:
    """``GET /metrics`` on the FastAPI ``app`` (every API server reads the shared folder)."""
    from fastapi import Response

    async def metrics() -> Response:
        body, ctype = metrics_text()
        return Response(content=body, media_type=ctype)

    app.add_api_route("/metrics", metrics, methods=["GET"], include_in_schema=False)


class PrometheusLogger(ls.Logger if ls is not None else object):  # type: ignore[misc]  # litserve is untyped
    """Turns the server's log events into prometheus-client metrics (runs in LitServe's logger process)."""

    def __init__(self) -> None:
        super().__init__()
        self._metrics: dict[str, Any] | None = (
            None  # made in the logger process, after $PROMETHEUS_MULTIPROC_DIR is set
        )
        # the logger process gets SIGKILL when the main process dies (geograph.serve.lifecycle)
        self._parent_guard = ParentGuard(signal.SIGKILL)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled in LitServe's logger process: it ignores SIGINT (a terminal's Ctrl-C reaches
        the whole process group; the main process stops the server and then this process)."""
        import multiprocessing as mp

        self.__dict__.update(state)
        # never in the main process (a copy there keeps its handlers); while a spawned child
        # unpickles its arguments, parent_process() is still None but the name is the child's
        if mp.current_process().name != "MainProcess":
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    def _make(self) -> dict[str, Any]:
        from prometheus_client import Counter, Histogram

        return {
            "requests": Counter("geograph_requests", "HTTP requests by endpoint and status", ["endpoint", "status"]),
            "errors": Counter(
                "geograph_request_errors", "HTTP requests answered with status >= 400", ["endpoint", "status"]
            ),
            "latency": Histogram(
                "geograph_request_latency_seconds",
                "time from request to response",
                ["endpoint"],
                buckets=LATENCY_BUCKETS,
            ),
            "batch": Histogram(
                "geograph_batch_size", "requests per inference batch", ["endpoint"], buckets=BATCH_BUCKETS
            ),
            "stages": Histogram(
                "geograph_stage_seconds",
                "a request's seconds in each stage of an inference worker",
                ["endpoint", "stage"],
                buckets=STAGE_BUCKETS,
            ),
        }

    def process(self, key: str, value: Any) -> None:
        if self._metrics is None:
            self._metrics = self._make()
        m = self._metrics
        if key == "request":
            endpoint, status, seconds = value
            m["requests"].labels(endpoint, str(status)).inc()
            if int(status) >= 400:
                m["errors"].labels(endpoint, str(status)).inc()
            m["latency"].labels(endpoint).observe(float(seconds))
        elif key == "batch":
            endpoint, size = value
            m["batch"].labels(f"/{endpoint}").observe(int(size))
        elif key == "stages":  # one batch part: its stages' seconds, and each request's wait in the queue
            endpoint, stages, queued = value
            for wait in queued:
                m["stages"].labels(f"/{endpoint}", "queue").observe(float(wait))
                for stage, seconds in stages.items():
                    if stage != "queue":
                        m["stages"].labels(f"/{endpoint}", stage).observe(float(seconds))


class RequestMetricsMiddleware:
    """ASGI middleware: logs ``("request", (endpoint, status, seconds))`` for every HTTP request.

    It wraps LitServe's own middlewares (added last, it runs first), so 413s of the payload
    limit are counted too. ``apis`` are the server's LitAPIs: their logger queue is set by
    LitServe before the API servers start. ``stopping`` is a shared flag the main process sets
    on SIGTERM/SIGINT: a request that fails while the server stops gets 503, not 500.
    """

    def __init__(self, app: ASGIApp, apis: Iterable[Any], stopping: ctypes.c_byte | None = None) -> None:
        self.app, self.apis, self.stopping = app, list(apis), stopping

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status, started = time.perf_counter(), [500], [False]

        async def send_(message: Message) -> None:
            if message["type"] == "http.response.start":
                started[0] = True
                if message["status"] == 500 and self.stopping is not None and self.stopping.value:
                    message = {**message, "status": 503}
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_)
        except BaseException as e:
            # uvicorn cancels requests still running when its graceful-shutdown time is up and
            # would answer 500: while stopping, answer 503 (the request may be retried elsewhere)
            if self.stopping is not None and self.stopping.value and status[0] == 500 and not started[0]:
                status[0] = 503
                body = b'{"detail":"the server is shutting down"}'
                await send(
                    {
                        "type": "http.response.start",
                        "status": 503,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                if isinstance(e, asyncio.CancelledError):
                    return  # answered, and the task ends here (uvicorn would print the cancellation as a traceback)
            raise
        finally:
            api = self.apis[0]
            if logging_enabled(api):
                api.log("request", (endpoint_label(scope["path"]), status[0], time.perf_counter() - start))
